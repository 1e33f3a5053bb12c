package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	tea "charm.land/bubbletea/v2"

	"ddflash/engine/planner"
	"ddflash/mamba"
)

func init() {
	register("tune", "tune the memory plan interactively; prints the serve flags on exit", runTune)
}

func runTune(args []string) error {
	fs := flag.NewFlagSet("tune", flag.ContinueOnError)
	var f planFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.maxRunning == 0 {
		f.maxRunning = 4 // a starting point; the keys change it
	}
	s, err := f.resolve(fs)
	if err != nil {
		return err
	}
	if s.models.Drafter == nil {
		// Load the drafter anyway so the spec key can switch to it; without
		// one, speculative settings show why they cannot plan.
		s.models.Drafter, _ = planner.LoadDrafter(f.draft)
		s.draftRef = f.draft
	}
	if fi, err := os.Stdout.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return errors.New("tune needs a terminal: use ddflash plan in scripts")
	}
	m := newTuneModel(s)
	if m.err != nil {
		return m.err
	}
	final, err := tea.NewProgram(m).Run()
	if err != nil {
		return fmt.Errorf("terminal UI: %w", err)
	}
	m = final.(*tuneModel)
	if m.err != nil {
		fmt.Fprintf(os.Stderr, "the last settings did not plan (%v); these flags are the last ones that did:\n", m.err)
	}
	fmt.Println(serveFlags(m.setup, m.plan))
	return nil
}

// tuneModel is the tuner's state: the knobs, the selected row and the plan
// they give. Every key recomputes the plan with planner.Compute.
type tuneModel struct {
	setup    *planSetup
	knobs    planner.Knobs
	selected int
	plan     *planner.Plan // the last plan that computed
	err      error         // why the current knobs do not plan
	width    int
}

func newTuneModel(s *planSetup) *tuneModel {
	m := &tuneModel{setup: s, knobs: s.knobs, width: 100}
	m.recompute()
	return m
}

// recompute plans the current knobs. On success the knobs take the plan's
// resolved values (defaults filled in), so the keys step from what is shown.
func (m *tuneModel) recompute() {
	p, err := planner.Compute(m.setup.models, m.knobs)
	m.err = err
	if err != nil {
		return
	}
	m.plan = p
	m.knobs = p.Settings
	if m.knobs.MemFraction == 0 && m.knobs.Reserve == 0 {
		m.knobs.MemFraction = p.MemFraction
	}
}

// tuneRow is one adjustable setting: its label, its value as text, and how
// the left/right keys change it (dir is -1 or +1).
type tuneRow struct {
	label  string
	value  func(k planner.Knobs) string
	change func(k *planner.Knobs, dir int)
}

var (
	kvDtypes   = []planner.DType{planner.BF16, planner.FP8, planner.FP16, planner.FP32}
	ssmDtypes  = []planner.DType{planner.FP32, planner.BF16, planner.FP16}
	convDtypes = []planner.DType{planner.BF16, planner.FP32, planner.FP16}
)

// cycle steps through a list, wrapping around.
func cycle[T comparable](list []T, cur T, dir int) T {
	for i, v := range list {
		if v == cur {
			return list[(i+dir+len(list))%len(list)]
		}
	}
	return list[0]
}

// scale doubles or halves v within [lo, hi].
func scale(v, dir, lo, hi int) int {
	if dir > 0 {
		return min(hi, v*2)
	}
	return max(lo, v/2)
}

func sglangOnly(k planner.Knobs, v string) string {
	if k.Mode != planner.ModeSGLang {
		return "(sglang mode)"
	}
	return v
}

func ddflashOnly(k planner.Knobs, v string) string {
	if k.Mode != planner.ModeDDFlash {
		return "(ddflash mode)"
	}
	return v
}

var tuneRows = []tuneRow{
	{"max running requests", func(k planner.Knobs) string { return fmt.Sprint(k.MaxRunningRequests) },
		func(k *planner.Knobs, d int) { k.MaxRunningRequests = max(1, k.MaxRunningRequests+d) }},
	{"spec", func(k planner.Knobs) string { return k.Spec.String() },
		func(k *planner.Knobs, d int) {
			k.Spec = cycle([]planner.Spec{planner.SpecAutoregressive, planner.SpecLinear, planner.SpecDDTree}, k.Spec, d)
		}},
	{"ddtree budget", func(k planner.Knobs) string {
		if k.Spec != planner.SpecDDTree {
			return "(ddtree only)"
		}
		return fmt.Sprint(k.Budget)
	}, func(k *planner.Knobs, d int) { k.Budget = max(1, k.Budget+d) }},
	{"tensor parallel", func(k planner.Knobs) string { return fmt.Sprint(k.TP) },
		func(k *planner.Knobs, d int) { k.TP = scale(k.TP, d, 1, 8) }},
	{"context tokens", func(k planner.Knobs) string { return planner.FormatCount(int64(k.Context)) },
		func(k *planner.Knobs, d int) { k.Context = scale(k.Context, d, 256, 1<<20) }},
	{"memory fraction", func(k planner.Knobs) string { return fmt.Sprintf("%.3f", k.MemFraction) },
		func(k *planner.Knobs, d int) {
			k.Reserve = 0 // the fraction replaces a --reserve given on the command line
			k.MemFraction = min(1, max(0.05, float64(int(k.MemFraction*100+0.5)+d)/100))
		}},
	{"KV dtype", func(k planner.Knobs) string { return k.KVDtype.Name },
		func(k *planner.Knobs, d int) { k.KVDtype = cycle(kvDtypes, k.KVDtype, d) }},
	{"ssm dtype", func(k planner.Knobs) string { return k.SSMDtype.Name },
		func(k *planner.Knobs, d int) { k.SSMDtype = cycle(ssmDtypes, k.SSMDtype, d) }},
	{"conv dtype", func(k planner.Knobs) string { return k.ConvDtype.Name },
		func(k *planner.Knobs, d int) { k.ConvDtype = cycle(convDtypes, k.ConvDtype, d) }},
	{"rollback", func(k planner.Knobs) string { return ddflashOnly(k, k.Rollback.String()) },
		func(k *planner.Knobs, d int) {
			if k.Mode == planner.ModeDDFlash {
				k.Rollback = cycle([]mamba.Strategy{mamba.Replay, mamba.Snapshot}, k.Rollback, d)
			}
		}},
	{"prefix-cache slots", func(k planner.Knobs) string { return ddflashOnly(k, fmt.Sprint(k.PrefixSlots)) },
		func(k *planner.Knobs, d int) { k.PrefixSlots = max(0, k.PrefixSlots+d) }},
	{"rules", func(k planner.Knobs) string { return k.Mode.String() },
		func(k *planner.Knobs, d int) {
			k.Mode = cycle([]planner.Mode{planner.ModeDDFlash, planner.ModeSGLang}, k.Mode, d)
			k.MemFraction, k.Reserve = 0, 0 // each mode has its own default
			k.Rollback = mamba.Replay
			if k.Mode == planner.ModeSGLang {
				k.Rollback = mamba.Snapshot
				if k.MaxMambaCacheSize == 0 {
					k.MaxMambaCacheSize = planner.ReportedMambaCacheSize
				}
			}
		}},
	{"sglang mamba slots", func(k planner.Knobs) string {
		if k.MaxMambaCacheSize == 0 {
			return sglangOnly(k, "ratio rule")
		}
		return sglangOnly(k, fmt.Sprint(k.MaxMambaCacheSize))
	}, func(k *planner.Knobs, d int) { k.MaxMambaCacheSize = max(0, k.MaxMambaCacheSize+d) }},
}

func (m *tuneModel) Init() tea.Cmd { return nil }

func (m *tuneModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width = msg.Width
	case tea.KeyPressMsg:
		switch msg.String() {
		case "q", "esc", "ctrl+c", "enter":
			return m, tea.Quit
		case "up", "k":
			m.selected = (m.selected + len(tuneRows) - 1) % len(tuneRows)
		case "down", "j":
			m.selected = (m.selected + 1) % len(tuneRows)
		case "left", "h", "-":
			m.change(-1)
		case "right", "l", "+", "=":
			m.change(+1)
		}
	}
	return m, nil
}

func (m *tuneModel) change(dir int) {
	tuneRows[m.selected].change(&m.knobs, dir)
	m.recompute()
}

// barLetters name each memory use in the bar and its legend.
var barLetters = map[string]byte{
	"CUDA context": 'c', "other processes": 'o',
	"runtime reserve (activations, workspace)": 'r', "runtime headroom (activations, CUDA graphs)": 'r',
	"target weights": 'W', "draft weights": 'w', "other static allocations": 'x',
	"KV cache": 'K', "draft KV cache": 'k', "GDN state slots": 'S', "prefix-cache checkpoints": 'P',
	"rollback: replay inputs": 'R', "rollback: per-token state snapshots": 'R',
	"unassigned": '.', "over budget": '!',
}

// memoryBar draws the memory split in width characters, giving each use its
// share by the largest-remainder rule so the bar is exactly width long.
func memoryBar(segs []planner.Segment, total int64, width int) string {
	type share struct {
		letter    byte
		cells     int
		remainder float64
	}
	shares := make([]share, 0, len(segs))
	used := 0
	for _, s := range segs {
		if s.Bytes <= 0 {
			continue
		}
		exact := float64(s.Bytes) / float64(total) * float64(width)
		shares = append(shares, share{barLetters[s.Use], int(exact), exact - float64(int(exact))})
		used += int(exact)
	}
	for left := width - used; left > 0 && len(shares) > 0; left-- {
		best := 0
		for i := range shares {
			if shares[i].remainder > shares[best].remainder {
				best = i
			}
		}
		shares[best].cells++
		shares[best].remainder = -1
	}
	var b strings.Builder
	for _, s := range shares {
		b.WriteString(strings.Repeat(string(s.letter), s.cells))
	}
	return b.String()
}

func (m *tuneModel) View() tea.View {
	var b strings.Builder
	s := m.setup
	fmt.Fprintf(&b, "ddflash tune: %s on %s (%s)\n", s.modelRef, s.device.Name, planner.FormatBytes(m.knobs.GPUTotal))
	fmt.Fprintln(&b, "up/down select, left/right change, q quits and prints the serve flags")
	fmt.Fprintln(&b)
	for i, row := range tuneRows {
		marker := "  "
		if i == m.selected {
			marker = "> "
		}
		fmt.Fprintf(&b, "%s%-22s %s\n", marker, row.label, row.value(m.knobs))
	}
	fmt.Fprintln(&b)
	if m.err != nil {
		fmt.Fprintf(&b, "cannot plan these settings: %v\n", m.err)
	} else {
		m.viewPlan(&b)
	}
	v := tea.NewView(wrapLines(b.String(), max(20, m.width-1)))
	v.AltScreen = true
	return v
}

// wrapLines breaks lines longer than width (in bytes, so a little early for
// non-ASCII text) at spaces; continuation lines are indented by four spaces.
func wrapLines(text string, width int) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		for len(line) > width {
			cut := strings.LastIndexByte(line[:width], ' ')
			if cut <= 4 {
				break // one long word: leave it to the terminal
			}
			out = append(out, line[:cut])
			line = "    " + strings.TrimLeft(line[cut:], " ")
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

func (m *tuneModel) viewPlan(b *strings.Builder) {
	p := m.plan
	width := max(20, min(100, m.width-4))
	fmt.Fprintf(b, "[%s]\n", memoryBar(p.Memory, p.Settings.GPUTotal, width))
	for _, seg := range p.Memory {
		if seg.Bytes >= 1<<20 {
			fmt.Fprintf(b, "  %c %-44s %10s %6.1f%%\n", barLetters[seg.Use], seg.Use, planner.FormatBytes(seg.Bytes), 100*float64(seg.Bytes)/float64(p.Settings.GPUTotal))
		}
	}
	fmt.Fprintln(b)
	writeResult(b, p)
	fmt.Fprintf(b, "\n%s\n", serveFlags(m.setup, p))
}
