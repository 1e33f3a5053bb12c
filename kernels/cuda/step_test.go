//go:build cgo

package cuda_test

import (
	"math"
	"os"
	"slices"
	"testing"

	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/kernels"
	"ddflash/kernels/cuda"
	"ddflash/mamba"
)

// TestEmulatedStep runs the engine's recorded steps on the CPU emulation
// (a child of TestEmulator): replayed decode, linear-verify and DDTree-
// verify steps give the eager steps' outputs bit for bit, one sequence and
// two at once, and a steady decode step costs what issue 34 allows.
func TestEmulatedStep(t *testing.T) {
	if os.Getenv("DDFLASH_LIBCUDA") == "" {
		t.Skip("runs as a child of TestEmulator")
	}
	be, err := cuda.New(0)
	must(t, err)
	p, err := testmodel.PresetByName("tiny")
	must(t, err)
	dir := t.TempDir()
	must(t, testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 7, DType: "bf16"}))
	t.Run("ReplayEqualsEager", func(t *testing.T) {
		for _, batch := range []int{1, 2} {
			taps := []int{1, 3}
			eager, replayed := newStepRun(t, be, dir, batch, true, taps), newStepRun(t, be, dir, batch, false, taps)
			eager.script(t, replayed)
		}
	})
	t.Run("DecodeCounts", func(t *testing.T) { checkDecodeCounts(t, be, dir) })
}

// stepRun is an engine with batch sequences that it steps by hand,
// tapping layers taps (as a drafter would ask).
type stepRun struct {
	e    *engine.Engine
	seqs []*stepSeq
	taps []int
}

type stepSeq struct {
	kv     engine.SeqKV
	slot   int
	len    int
	verify *mamba.Verify
}

func newStepRun(t *testing.T, be kernels.Backend, dir string, batch int, eager bool, taps []int) *stepRun {
	const verify = 6
	e, err := engine.Load(be, dir, engine.Options{PageSize: 4, Context: 96, MaxSeqs: batch, VerifyTokens: verify})
	must(t, err)
	t.Cleanup(e.Close)
	e.Model.Eager = eager
	r := &stepRun{e: e, taps: taps}
	for range batch {
		s := &stepSeq{}
		s.slot, err = e.Model.States.Acquire()
		must(t, err)
		s.verify, err = mamba.NewVerify(e.Model.States, mamba.Replay, verify)
		must(t, err)
		t.Cleanup(s.verify.Close)
		r.seqs = append(r.seqs, s)
	}
	return r
}

// step runs one forward of every sequence: tokens[i] for sequence i, as a
// tree when parents is set, a verify when spec is, and returns the outputs.
func (r *stepRun) step(t *testing.T, tokens [][]int32, parents []int32, spec bool, top int) []engine.SeqOutput {
	t.Helper()
	var in []engine.SeqInput
	for i, s := range r.seqs {
		must(t, r.e.Model.KV.Reserve(&s.kv, s.len+len(tokens[i])))
		sq := engine.SeqInput{Tokens: tokens[i], Start: s.len, KV: &s.kv, Slot: s.slot, Logits: engine.AllRows, Parents: parents, Top: top}
		if spec {
			sq.Spec = s.verify
		} else if len(tokens[i]) == 1 {
			sq.Logits = engine.LastRow
		}
		in = append(in, sq)
	}
	out, err := r.e.Model.Forward(in, r.taps)
	must(t, err)
	if !spec {
		for i, s := range r.seqs {
			s.len += len(tokens[i])
		}
	}
	return out
}

// commit keeps path of every sequence's verify.
func (r *stepRun) commit(t *testing.T, path []int32) {
	t.Helper()
	for _, s := range r.seqs {
		must(t, s.verify.Commit(r.e.Model.States, s.slot, path))
		must(t, r.e.Model.CommitKV(&s.kv, s.len, path))
		s.len += len(path)
		r.e.Model.KV.Truncate(&s.kv, s.len)
	}
}

// script runs the same steps on r (eager) and on o (recording and
// replaying): a prefill, decode steps (full logits and device top-k), and
// linear and tree verifies with commits between them, each kind three
// times or more (run op by op, recorded, replayed), comparing every
// output bit for bit; from the third time on a step of o must be one
// launch, the replay.
func (r *stepRun) script(t *testing.T, o *stepRun) {
	batch := len(r.seqs)
	toks := func(n, salt int) [][]int32 {
		var out [][]int32
		for i := range batch {
			row := make([]int32, n)
			for j := range row {
				row[j] = int32((salt*31 + i*17 + j*7) % 300)
			}
			out = append(out, row)
		}
		return out
	}
	same := func(what string, step int, a, b []engine.SeqOutput) {
		t.Helper()
		for i := range a {
			if !slices.Equal(bits(a[i].Logits), bits(b[i].Logits)) || !slices.Equal(a[i].TopIDs, b[i].TopIDs) ||
				!slices.Equal(bits(a[i].TopLogits), bits(b[i].TopLogits)) || !slices.Equal(bits(a[i].Features), bits(b[i].Features)) {
				t.Fatalf("batch %d, %s step %d, sequence %d: the replayed step's outputs differ from the eager step's", batch, what, step, i)
			}
		}
	}
	both := func(what string, step int, tokens [][]int32, parents []int32, spec bool, top int) {
		t.Helper()
		want := r.step(t, tokens, parents, spec, top)
		before := mustCounts(t)
		got := o.step(t, tokens, parents, spec, top)
		if c := mustCounts(t).Sub(before); step >= 2 && c.Launches != 1 {
			t.Errorf("batch %d, %s step %d: %d launches, want the one replay", batch, what, step, c.Launches)
		}
		same(what, step, want, got)
	}
	both("prefill", 0, toks(9, 1), nil, false, 0)
	for i := range 4 {
		both("decode", i, toks(1, 10+i), nil, false, 0)
	}
	for i := range 3 {
		both("greedy decode", i, toks(1, 20+i), nil, false, 1)
	}
	for i := range 3 {
		both("linear verify", i, toks(4, 30+i), nil, true, 0)
		for _, run := range []*stepRun{r, o} {
			run.commit(t, []int32{0, 1, 2}[:1+i%3])
		}
	}
	parents := []int32{-1, 0, 0, 1, 2} // five nodes a sequence: 10 rows on cuBLASLt when batched
	for i := range 3 {
		both("tree verify", i, toks(5, 40+i), parents, true, 3)
		for _, run := range []*stepRun{r, o} {
			run.commit(t, [][]int32{{0, 2, 4}, {0, 1, 3}, {0}}[i])
		}
	}
}

// checkDecodeCounts measures a steady greedy decode step, the top-k on the
// device, with the emulated driver's counters: one launch (the replay), no
// allocation, one synchronising download of a few bytes (issue 34: ≤ 2
// launches, 0 allocations, ≤ 1 synchronising download). It logs what a
// DDTree generation costs per verify step, drafting and commit included.
func checkDecodeCounts(t *testing.T, be kernels.Backend, dir string) {
	run := newStepRun(t, be, dir, 2, false, nil)
	run.step(t, [][]int32{{5, 6, 7}, {8, 9, 10}}, nil, false, 0)
	for i := range 3 { // op by op, recorded, replayed
		run.step(t, [][]int32{{int32(11 + i)}, {int32(21 + i)}}, nil, false, 1)
	}
	before, ok := cuda.EmulatorCounts()
	if !ok {
		t.Fatal("the emulated driver has no counters")
	}
	out := run.step(t, [][]int32{{14}, {24}}, nil, false, 1)
	got := mustCounts(t).Sub(before)
	t.Logf("a steady decode step of 2 sequences: %v", got)
	if got.Launches > 2 || got.Allocs != 0 || got.Downloads > 1 || got.Uploads > 1 {
		t.Errorf("a steady decode step cost %v; want ≤ 2 launches, no allocation, ≤ 1 download and 1 upload", got)
	}
	if len(out[0].TopIDs) != 1 || len(out[1].TopIDs) != 1 {
		t.Errorf("the step returned %d and %d top ids, want 1 each", len(out[0].TopIDs), len(out[1].TopIDs))
	}
}

func mustCounts(t *testing.T) kernels.DriverCounts {
	t.Helper()
	c, ok := cuda.EmulatorCounts()
	if !ok {
		t.Fatal("the emulated driver has no counters")
	}
	return c
}

// bits is v's bit patterns, so that comparisons tell -0 from 0 and NaNs apart.
func bits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}
