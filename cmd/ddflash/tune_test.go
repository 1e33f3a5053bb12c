package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"ddflash/engine/planner"
	"ddflash/mamba"
)

// tmuxSession drives a program in a detached tmux server of its own.
type tmuxSession struct {
	t      *testing.T
	socket string
}

func startTmux(t *testing.T, command string) *tmuxSession {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is not installed: run make deps (scripts/deps.sh installs it)")
	}
	s := &tmuxSession{t: t, socket: fmt.Sprintf("ddflash-tune-test-%d", os.Getpid())}
	s.run("-f", "/dev/null", "new-session", "-d", "-s", "tune", "-x", "120", "-y", "60", command)
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", s.socket, "kill-server").Run() })
	return s
}

func (s *tmuxSession) run(args ...string) string {
	s.t.Helper()
	cmd := exec.Command("tmux", append([]string{"-L", s.socket}, args...)...)
	cmd.Env = append(os.Environ(), "TMUX=") // work the same inside another tmux
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// screen captures the pane, joining lines the terminal wrapped.
func (s *tmuxSession) screen() string { return s.run("capture-pane", "-p", "-J", "-t", "tune") }

func (s *tmuxSession) keys(keys ...string) {
	for _, k := range keys {
		s.run("send-keys", "-t", "tune", k)
	}
}

// waitFor polls the screen until ok accepts it.
func (s *tmuxSession) waitFor(what string, ok func(screen string) bool) string {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		screen := s.screen()
		if ok(screen) {
			return screen
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s; screen:\n%s", what, screen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var kvTokensLine = regexp.MustCompile(`KV tokens\s+([\d,]+)`)

// waitForPlan waits until the screen shows the KV tokens and the running
// request limits that planner.Compute gives for k.
func (s *tmuxSession) waitForPlan(m planner.Models, k planner.Knobs) string {
	s.t.Helper()
	p, err := planner.Compute(m, k)
	if err != nil {
		s.t.Fatal(err)
	}
	wantKV := planner.FormatCount(p.KVTokens)
	mr := p.MaxRunning
	wantLimits := fmt.Sprintf("max running requests  %d (requested %d, KV cap %s, slot cap %d)",
		mr.Effective, mr.Requested, planner.FormatCount(int64(mr.KVCap)), mr.SlotCap)
	return s.waitFor(wantKV+" KV tokens and "+wantLimits, func(screen string) bool {
		got := kvTokensLine.FindStringSubmatch(screen)
		return got != nil && got[1] == wantKV && strings.Contains(screen, wantLimits)
	})
}

func repeat(key string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = key
	}
	return keys
}

func rowIndex(t *testing.T, label string) int {
	for i, r := range tuneRows {
		if r.label == label {
			return i
		}
	}
	t.Fatalf("no tune row %q", label)
	return -1
}

// TestTuneInTmux runs the real binary in a terminal, changes settings with
// the keys, and checks that the screen shows what planner.Compute says.
func TestTuneInTmux(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ddflash")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	target, err := planner.LoadTarget("qwen3.6-27b")
	if err != nil {
		t.Fatal(err)
	}
	drafter, err := planner.LoadDrafter("qwen3.6-27b-dflash")
	if err != nil {
		t.Fatal(err)
	}
	m := planner.Models{Target: target, Drafter: drafter}
	s := startTmux(t, bin+" tune --gpu rtx-pro-6000 --max-running-requests 4; echo TUNE-EXIT $?; sleep 60")

	k := planner.Knobs{GPUTotal: 97887 << 20, MaxRunningRequests: 4, Spec: planner.SpecDDTree}
	s.waitForPlan(m, k)

	s.keys("Right") // max running requests 4 -> 5
	k.MaxRunningRequests = 5
	s.waitForPlan(m, k)

	rollback, rules := rowIndex(t, "rollback"), rowIndex(t, "rules")
	s.keys(repeat("Down", rollback)...)
	s.keys("Right") // replay -> snapshot
	k.Rollback = mamba.Snapshot
	s.waitForPlan(m, k)

	s.keys(repeat("Down", rules-rollback)...)
	s.keys("Right") // ddflash -> sglang rules, starting from the reported deployment's 24 slots
	k.Mode, k.MaxMambaCacheSize = planner.ModeSGLang, planner.ReportedMambaCacheSize
	s.waitForPlan(m, k)

	s.keys(repeat("Up", rules)...)
	s.keys(repeat("Right", 3)...) // 5 -> 8 running requests: the reported 11,893 tokens
	k.MaxRunningRequests = 8
	screen := s.waitForPlan(m, k)
	for _, want := range []string{"KV tokens             11,893", "> max running requests   8", "rules                  sglang",
		"cap running requests at 6, below the 8 requested"} {
		if !strings.Contains(screen, want) {
			t.Errorf("screen lacks %q:\n%s", want, screen)
		}
	}
	t.Logf("screen:\n%s", screen)

	s.keys("q")
	final := s.waitFor("exit", func(screen string) bool { return strings.Contains(screen, "TUNE-EXIT") })
	for _, want := range []string{"TUNE-EXIT 0", "sglang flags: --tp-size 1 --max-running-requests 8", "--max-mamba-cache-size 24", "--speculative-num-draft-tokens 16"} {
		if !strings.Contains(final, want) {
			t.Errorf("after quitting, screen lacks %q:\n%s", want, final)
		}
	}
}

// TestTuneRowsStepBothWays checks, in process, that every row's right key
// changes what is shown (or says why it does not apply) and the left key
// undoes it, each time with a plan that agrees with planner.Compute.
func TestTuneRowsStepBothWays(t *testing.T) {
	target, _ := planner.LoadTarget("qwen3.6-27b")
	drafter, _ := planner.LoadDrafter("qwen3.6-27b-dflash")
	setup := &planSetup{
		models:   planner.Models{Target: target, Drafter: drafter},
		knobs:    planner.Knobs{GPUTotal: 97887 << 20, MaxRunningRequests: 4, Spec: planner.SpecDDTree},
		modelRef: "qwen3.6-27b", draftRef: "qwen3.6-27b-dflash",
	}
	m := newTuneModel(setup)
	press := func(code rune) {
		next, _ := m.Update(tea.KeyPressMsg{Code: code})
		m = next.(*tuneModel)
	}
	for i, row := range tuneRows {
		if m.selected != i {
			t.Fatalf("row %d: selection at %d", i, m.selected)
		}
		before := row.value(m.knobs)
		press(tea.KeyRight)
		after := row.value(m.knobs)
		applies := !strings.HasPrefix(before, "(")
		if m.err != nil || (applies && after == before) || (!applies && after != before) {
			t.Errorf("%s: %q -> %q (error %v)", row.label, before, after, m.err)
		}
		if want, err := planner.Compute(setup.models, m.knobs); err != nil || want.KVTokens != m.plan.KVTokens {
			t.Errorf("%s: shown plan has %d KV tokens, planner says %v (%v)", row.label, m.plan.KVTokens, want, err)
		}
		press(tea.KeyLeft)
		if back := row.value(m.knobs); back != before {
			t.Errorf("%s: left after right gives %q, want %q", row.label, back, before)
		}
		press(tea.KeyDown)
	}
	if m.selected != 0 {
		t.Errorf("down from the last row goes to %d, want 0", m.selected)
	}
	if _, cmd := m.Update(tea.KeyPressMsg{Code: 'q', Text: "q"}); cmd == nil {
		t.Error("q does not quit")
	}
}

// TestEverySegmentHasABarLetter plans with every kind of memory use (a
// drafter, prefix-cache slots, snapshots; ddflash and SGLang rules) and
// checks that tune's bar has a letter for each.
func TestEverySegmentHasABarLetter(t *testing.T) {
	target, _ := planner.LoadTarget("qwen3.6-27b")
	drafter, _ := planner.LoadDrafter("qwen3.6-27b-dflash")
	for _, k := range []planner.Knobs{
		{GPUTotal: 97887 << 20, MaxRunningRequests: 4, Spec: planner.SpecDDTree, PrefixSlots: 2},
		{GPUTotal: 97887 << 20, MaxRunningRequests: 4, Spec: planner.SpecDDTree, Rollback: mamba.Snapshot, Mode: planner.ModeSGLang},
	} {
		p, err := planner.Compute(planner.Models{Target: target, Drafter: drafter}, k)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range p.Memory {
			if _, ok := barLetters[s.Use]; !ok {
				t.Errorf("no bar letter for %q", s.Use)
			}
		}
	}
}
