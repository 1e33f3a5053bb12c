package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"ddflash/bench"
	"ddflash/engine/testmodel"
)

func buildDdflash(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ddflash")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// writeTinyPair writes the random tiny target and drafter with the binary.
func writeTinyPair(t *testing.T, bin string) (model, draft string) {
	t.Helper()
	dir := t.TempDir()
	model, draft = filepath.Join(dir, "tiny"), filepath.Join(dir, "tiny-dflash")
	if out, err := exec.Command(bin, "testmodel", "--out", model, "--draft-out", draft, "--seed", "5").CombinedOutput(); err != nil {
		t.Fatalf("testmodel: %v\n%s", err, out)
	}
	return model, draft
}

var savedLine = regexp.MustCompile(`saved (\S+) (\S+):`)

// startSweep starts the binary. Every "saved CONFIG RUN" line it prints
// (the run is on disk by then) is added to saved and signalled on events.
func startSweep(t *testing.T, bin string, args []string, saved *sync.Map) (cmd *exec.Cmd, events <-chan struct{}, done <-chan error) {
	t.Helper()
	cmd = exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ev, dn := make(chan struct{}, 100), make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := savedLine.FindStringSubmatch(sc.Text()); m != nil {
				saved.Store(m[1]+" "+m[2], true)
				ev <- struct{}{}
			}
		}
		dn <- cmd.Wait()
	}()
	return cmd, ev, dn
}

// runSet reads the (config, run) pairs stored in dir, failing the test on
// any file that does not pass verification other than by being incomplete.
func runSet(t *testing.T, dir string) map[string]bool {
	t.Helper()
	v, err := bench.Verify(dir)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]bool{}
	}
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	for _, f := range v.Findings {
		if f.Damaged || (!f.OK && !strings.HasPrefix(f.Problem, "incomplete") && f.Problem != "no result file") {
			t.Fatalf("after a kill, %s: %s", f.Config, f.Problem)
		}
		rec, err := bench.Store{Dir: dir}.ReadRecord(f.Config)
		if err != nil {
			t.Fatal(err)
		}
		if rec != nil {
			for _, r := range rec.Runs {
				set[f.Config+" "+r.RunKey.String()] = true
			}
		}
	}
	return set
}

// TestBenchSurvivesSIGKILL kills a sweep at random moments, resumes it each
// time, and compares the result with an uninterrupted sweep: no saved run
// is ever lost, no file is ever partial, and the final results (everything
// but timings) are the same.
func TestBenchSurvivesSIGKILL(t *testing.T) {
	bin := buildDdflash(t)
	model, draft := writeTinyPair(t, bin)
	args := []string{"bench", "--model", model, "--draft", draft, "--modes", "auto,linear,b4",
		"--max-tokens", "6,10", "--workloads", "fibonacci,chat", "--repeats", "1", "--warmup", "0", "--threads", "1"}
	tmp := t.TempDir()
	ref, killed := filepath.Join(tmp, "ref"), filepath.Join(tmp, "killed")

	start := time.Now()
	if out, err := exec.Command(bin, append(args, "--out", ref)...).CombinedOutput(); err != nil {
		t.Fatalf("uninterrupted sweep: %v\n%s", err, out)
	}
	full := time.Since(start)

	seed := uint64(time.Now().UnixNano())
	t.Logf("kill points from seed %d; the uninterrupted sweep took %v", seed, full)
	rng := rand.New(rand.NewPCG(seed, 1))
	const totalRuns = 3 * 2 * 2
	perRun := full / totalRuns
	var saved sync.Map
	have := map[string]bool{}
	kills := 0
	for attempt := 0; attempt < 4*totalRuns && len(have) < totalRuns; attempt++ {
		// Kill after 0 or 1 more saved runs plus up to one run's time: at a
		// random point of a run, sometimes in the middle of its writes.
		cmd, events, done := startSweep(t, bin, append(args, "--out", killed, "--resume"), &saved)
		wait := rng.IntN(2)
		timer := time.After(time.Hour)
		if wait == 0 {
			timer = time.After(time.Duration(rng.Float64() * float64(perRun)))
		}
		for ended := false; !ended; {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("attempt %d: %v", attempt, err)
				}
				ended = true
			case <-events:
				if wait--; wait == 0 {
					timer = time.After(time.Duration(rng.Float64() * float64(perRun)))
				}
			case <-timer:
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				<-done
				kills++
				ended = true
			}
		}
		now := runSet(t, killed)
		for k := range have {
			if !now[k] {
				t.Fatalf("attempt %d: %s was on disk before the kill and is gone", attempt, k)
			}
		}
		saved.Range(func(k, _ any) bool {
			if !now[k.(string)] {
				t.Fatalf("attempt %d: the sweep said %s was saved, but it is not on disk", attempt, k)
			}
			return true
		})
		have = now
	}
	t.Logf("%d kills, %d of %d runs done before the final resume", kills, len(have), totalRuns)
	if kills < 4 {
		t.Fatalf("only %d kills happened", kills)
	}
	if out, err := exec.Command(bin, append(args, "--out", killed, "--resume")...).CombinedOutput(); err != nil {
		t.Fatalf("final resume: %v\n%s", err, out)
	}
	if got := runSet(t, killed); len(got) != totalRuns {
		t.Fatalf("%d runs after the final resume, want %d", len(got), totalRuns)
	}
	if v, err := bench.Verify(killed); err != nil || len(v.Temps) > 0 {
		t.Errorf("temporary files of killed writes outlived the resume: %v, %v", v.Temps, err)
	}
	for _, config := range []string{"tp1-auto", "tp1-linear", "tp1-b4"} {
		want, got := normalize(t, ref, config), normalize(t, killed, config)
		if !reflect.DeepEqual(want, got) {
			t.Errorf("%s differs from the uninterrupted sweep\n got %s\nwant %s", config, jsonText(got), jsonText(want))
		}
	}

	out, err := exec.Command(bin, "bench", "verify", killed).CombinedOutput()
	if err != nil || strings.Count(string(out), "ok ") != 3 {
		t.Errorf("verify of the resumed sweep: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "bench", "report", killed).Output()
	if err != nil || strings.Count(string(out), "\n| 1 | ") != totalRuns {
		t.Errorf("report: %v\n%s", err, out)
	}
	for _, ext := range []string{".md", ".csv", ".svg", ".bench.txt"} {
		if _, err := os.Stat(filepath.Join(killed, "report"+ext)); err != nil {
			t.Errorf("report file: %v", err)
		}
	}
}

// TestBenchAgainstABrokenServerFails: a server that accepts connections
// and answers every request with an error yields a failure record and a
// non-zero exit, never a result, and verify says to rerun it.
func TestBenchAgainstABrokenServerFails(t *testing.T) {
	bin := buildDdflash(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"data":[{"id":"qwen"}]}`)
			return
		}
		http.Error(w, `{"error":{"message":"no KV cache left"}}`, http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "results")
	cmd := exec.Command(bin, "bench", "--url", srv.URL, "--modes", "b8", "--max-tokens", "16", "--workloads", "fibonacci", "--out", out)
	stderr, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(stderr), "503 Service Unavailable") {
		t.Fatalf("exit %v, output:\n%s", err, stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "tp1-b8.json")); !os.IsNotExist(err) {
		t.Errorf("a result file was written for a server that served nothing (stat: %v)", err)
	}
	if _, err := os.Stat(filepath.Join(out, "tp1-b8.failure.json")); err != nil {
		t.Errorf("no failure record: %v", err)
	}
	verify, err := exec.Command(bin, "bench", "verify", out).CombinedOutput()
	if err == nil || !strings.Contains(string(verify), "RERUN  tp1-b8") || !strings.Contains(string(verify), "--url "+srv.URL) {
		t.Errorf("verify: %v\n%s", err, verify)
	}
}

// normalized is a record without what legitimately changes between two
// sweeps of the same plan: timings, timestamps, telemetry, paths.
type normalized struct {
	Config   string
	Knobs    bench.Knobs
	Model    string
	Drafter  string
	Plan     []bench.RunKey
	Complete bool
	Runs     []normalizedRun
}

type normalizedRun struct {
	Key                          bench.RunKey
	Requested, Completed, Failed int
	InputTokens, OutputTokens    int
	OutputsSHA256, TokenCounts   string
	Spec                         *bench.SpecCounter
	Tokens                       [][]int32
}

func normalize(t *testing.T, dir, config string) normalized {
	t.Helper()
	st := bench.Store{Dir: dir}
	rec, err := st.ReadRecord(config)
	if err != nil || rec == nil {
		t.Fatalf("%s/%s: %v", dir, config, err)
	}
	n := normalized{Config: rec.Config, Knobs: rec.Setup.Knobs, Model: rec.Setup.Model.SHA256, Drafter: rec.Setup.Drafter.SHA256, Plan: rec.Setup.Plan, Complete: rec.Complete}
	for _, r := range rec.Runs {
		reqs, err := st.ReadTrace(r.Trace)
		if err != nil {
			t.Fatal(err)
		}
		nr := normalizedRun{Key: r.RunKey, Requested: r.Requested, Completed: r.Completed, Failed: r.Failed,
			InputTokens: r.InputTokens, OutputTokens: r.OutputTokens, OutputsSHA256: r.OutputsSHA256, TokenCounts: r.TokenCounts, Spec: r.Metrics.SpecDecode}
		for _, q := range reqs {
			nr.Tokens = append(nr.Tokens, q.Tokens)
		}
		n.Runs = append(n.Runs, nr)
	}
	return n
}

func jsonText(v any) string {
	data, _ := json.MarshalIndent(v, "", " ")
	return string(data)
}

// TestBenchComparesMTPAndDFlash runs one sweep over the target's MTP head
// (two step counts), the DFlash drafter, a DFlash2 drafter (--draft2),
// adaptive and adaptive choosing between the DFlash drafter and the head
// on a target that has all of them, and one over MTP modes alone
// without a drafter: every run verifies, greedy ones token for token
// against autoregressive, and each record says its drafter and that
// drafter's block (the modes share one engine and swap its drafter).
func TestBenchComparesMTPAndDFlash(t *testing.T) {
	bin := buildDdflash(t)
	dir := t.TempDir()
	model, draft, draft2 := filepath.Join(dir, "tiny"), filepath.Join(dir, "tiny-dflash"), filepath.Join(dir, "tiny-dflash2")
	if out, err := exec.Command(bin, "testmodel", "--out", model, "--draft-out", draft, "--mtp", "--seed", "5").CombinedOutput(); err != nil {
		t.Fatalf("testmodel: %v\n%s", err, out)
	}
	// The same target (same seed) with a DFlash2 drafter of block 8.
	if out, err := exec.Command(bin, "testmodel", "--out", filepath.Join(dir, "tiny-again"), "--draft-out", draft2, "--draft-dflash2", "--draft-block", "8", "--seed", "5").CombinedOutput(); err != nil {
		t.Fatalf("testmodel --draft-dflash2: %v\n%s", err, out)
	}
	common := []string{"--model", model, "--max-tokens", "24", "--workloads", "fibonacci", "--num-prompts", "2", "--repeats", "1", "--warmup", "0", "--raw"}
	for _, c := range []struct {
		args    []string
		configs []string
	}{
		{[]string{"--draft", draft, "--draft2", draft2, "--modes", "auto,mtp2,mtp4,linear,dflash2,b8,b16,adaptive,adaptive-mtp,adaptive-mtp-d4"},
			[]string{"tp1-auto", "tp1-mtp2", "tp1-mtp4", "tp1-linear", "tp1-dflash2", "tp1-b8", "tp1-b16", "tp1-adaptive", "tp1-adaptive-mtp", "tp1-adaptive-mtp-d4"}},
		{[]string{"--modes", "auto,mtp3"}, []string{"tp1-auto", "tp1-mtp3"}},
	} {
		out := t.TempDir()
		args := append(append([]string{"bench", "--out", out}, common...), c.args...)
		if msg, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("bench %v: %v\n%s", c.args, err, msg)
		}
		v, err := bench.Verify(out)
		if err != nil {
			t.Fatal(err)
		}
		if !v.OK() || len(v.Findings) != len(c.configs) {
			var buf strings.Builder
			v.Print(&buf)
			t.Fatalf("bench %v: verify:\n%s", c.args, buf.String())
		}
		for _, name := range c.configs {
			rec, err := bench.Store{Dir: out}.ReadRecord(name)
			if err != nil || rec == nil {
				t.Fatalf("%s: %v", name, err)
			}
			k := rec.Setup.Knobs
			block, drafter := 16, "" // the DFlash drafter's
			if steps, ok := strings.CutPrefix(name, "tp1-mtp"); ok {
				block, drafter = int(steps[0]-'0')+1, bench.MTPDrafter
			} else if name == "tp1-dflash2" {
				block, drafter = 8, bench.DFlash2Drafter
			} else if name == "tp1-adaptive-mtp" {
				drafter = bench.ChoiceDrafters // the larger block: the DFlash drafter's
			} else if name == "tp1-adaptive-mtp-d4" {
				block, drafter = 5, bench.ChoiceDrafters // the DFlash drafter's, cut to 4 proposals
			}
			if name != "tp1-auto" && (k.BlockSize != block || k.Drafter != drafter) {
				t.Errorf("%s: drafter %q, block %d; want %q, %d", name, k.Drafter, k.BlockSize, drafter, block)
			}
		}
	}
}

// TestGenerateAdaptiveWithMTP: generate --spec adaptive --with-mtp (the
// target's MTP head and a DFlash drafter, chosen between per step) gives
// the autoregressive tokens, greedy and sampled with a seed.
func TestGenerateAdaptiveWithMTP(t *testing.T) {
	bin := buildDdflash(t)
	dir := t.TempDir()
	model, draft := filepath.Join(dir, "tiny"), filepath.Join(dir, "tiny-dflash")
	if out, err := exec.Command(bin, "testmodel", "--out", model, "--draft-out", draft, "--mtp", "--seed", "6").CombinedOutput(); err != nil {
		t.Fatalf("testmodel: %v\n%s", err, out)
	}
	for _, temp := range []string{"0", "0.8"} {
		generate := func(spec ...string) string {
			args := append([]string{"generate", "--model", model, "--draft", draft, "--tokens", "5,17,99,3", "--max-tokens", "40", "--temperature", temp, "--seed", "4", "--json"}, spec...)
			out, err := exec.Command(bin, args...).Output()
			if err != nil {
				t.Fatalf("generate %v: %v", spec, err)
			}
			var res struct{ Tokens []int32 }
			if err := json.Unmarshal(out, &res); err != nil || len(res.Tokens) == 0 {
				t.Fatalf("generate %v: %v\n%s", spec, err, out)
			}
			return fmt.Sprint(res.Tokens)
		}
		if got, want := generate("--spec", "adaptive", "--with-mtp", "--mtp-steps", "3"), generate("--spec", "auto"); got != want {
			t.Errorf("temperature %s: --spec adaptive --with-mtp gave %s, autoregressive %s", temp, got, want)
		}
	}
}

// TestBenchPlansEveryDrafter: under --gpu-mem, bench's memory plan counts
// the MTP head beside the DFlash drafter when mtpN and DFlash modes run
// together, and the DFlash2 drafter beside the DFlash one when dflash2 and
// DFlash modes do (fewer KV tokens than for the DFlash modes alone, which
// plan fewer than autoregressive decoding).
func TestBenchPlansEveryDrafter(t *testing.T) {
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	model, draft, draft2 := filepath.Join(dir, "tiny"), filepath.Join(dir, "draft"), filepath.Join(dir, "draft2")
	if err := testmodel.Write(model, testmodel.Options{Preset: p, Seed: 3, MTP: true}); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteDrafter(draft, testmodel.DraftOptions{Target: p, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteDrafter(draft2, testmodel.DraftOptions{Target: p, Seed: 4, BlockSize: 8, DFlash2: true}); err != nil {
		t.Fatal(err)
	}
	kvTokens := func(modes string) int {
		var mf modelFlags
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		mf.register(fs)
		if err := fs.Parse([]string{"--model", model, "--draft", draft, "--context", "256"}); err != nil {
			t.Fatal(err)
		}
		plan, err := bench.ParseModes(modes)
		if err != nil {
			t.Fatal(err)
		}
		_, planned, err := sizeForModes(&mf, map[string]string{"": draft, bench.DFlash2Drafter: draft2}, plan)
		if err != nil {
			t.Fatal(err)
		}
		mf.draft = planned
		opts, err := benchSizing(&mf, fs, 2, "1GiB", 0)
		if err != nil {
			t.Fatalf("%s: %v", modes, err)
		}
		return opts.KVTokens
	}
	auto, dflashOnly, both := kvTokens("auto"), kvTokens("auto,linear,b8"), kvTokens("auto,mtp2,linear,b8")
	if !(both < dflashOnly && dflashOnly < auto) {
		t.Errorf("KV tokens planned: %d with the head and the drafter, %d with the drafter, %d with neither", both, dflashOnly, auto)
	}
	dflash2Only, twoDrafters := kvTokens("auto,dflash2"), kvTokens("auto,linear,b8,dflash2")
	if !(twoDrafters < dflashOnly && twoDrafters < dflash2Only && dflash2Only < auto) {
		t.Errorf("KV tokens planned: %d with both DFlash drafters, %d with --draft's, %d with --draft2's, %d with neither", twoDrafters, dflashOnly, dflash2Only, auto)
	}
}
