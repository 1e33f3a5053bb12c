//go:build cgo

package cuda_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"testing"

	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/engine/planner"
	"ddflash/engine/testmodel"
	"ddflash/internal/enginetest"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/kernels/cuda"
	"ddflash/mamba"
	"ddflash/mtp"
)

// Whole-model checks against the CPU backend, run on the GPU by
// model_gpu_test.go (build tag cuda) and on the CPU emulation of the driver
// by TestEmulatedModel (a child of TestEmulator in emu_test.go).

// TestEmulatedModel runs the model checks on the tiny preset when
// DDFLASH_LIBCUDA names the CPU emulation.
func TestEmulatedModel(t *testing.T) {
	if os.Getenv("DDFLASH_LIBCUDA") == "" {
		t.Skip("runs as a child of TestEmulator")
	}
	be, err := cuda.New(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("Logits", func(t *testing.T) { checkModelLogits(t, be, "tiny", "bf16") })
	t.Run("LogitsFP8", func(t *testing.T) { checkModelLogits(t, be, "tiny", "fp8") })
	t.Run("LogitsH256", func(t *testing.T) { checkModelLogits(t, be, "tiny-h256", "bf16") })
	t.Run("Spec", func(t *testing.T) { checkSpecGeneration(t, be) })
	t.Run("SpecBF16State", func(t *testing.T) { checkSpecLosslessBF16State(t, be) })
	t.Run("DraftLogits", func(t *testing.T) { checkDraftLogits(t, be) })
	t.Run("DFlash2", func(t *testing.T) { checkDFlash2(t, be) })
	t.Run("MTP", func(t *testing.T) { checkMTP(t, be) })
	t.Run("Close", func(t *testing.T) { checkCloseReleases(t, be) })
	t.Run("PlannedAllocation", func(t *testing.T) { checkPlannedAllocation(t, be) })
}

// checkPlannedAllocation plans a tiny bf16 pair in 1 GiB as serve does
// (planner.Compute, Plan.EngineOptions), loads it, runs a full batch of
// speculative requests through the scheduler, and checks that the device
// buffers it holds are within 2 % (or 64 MiB) of what the plan assigns to
// weights, caches, state slots and rollback.
func checkPlannedAllocation(t *testing.T, be kernels.Backend) {
	held := be.(interface{ BufferBytes() int64 }).BufferBytes
	target, draft := tinyBF16Pair(t, 6)
	var models planner.Models
	var err error
	models.Target, err = planner.LoadTarget(target)
	must(t, err)
	models.Drafter, err = planner.LoadDrafter(draft)
	must(t, err)
	spec := engine.SpecOptions{Mode: engine.SpecTree, Budget: 4, Rollback: mamba.Replay}
	plan, err := planner.Compute(models, planner.Knobs{GPUTotal: 1 << 30, MaxRunningRequests: 2, Context: 256, Spec: planner.SpecDDTree,
		Budget: spec.Budget, Rollback: spec.Rollback, KVDtype: planner.BF16, ConvDtype: planner.BF16, SSMDtype: planner.FP32})
	must(t, err)
	must(t, plan.Fits())
	opts, err := plan.EngineOptions()
	must(t, err)
	opts.VerifyTokens, err = dflash.VerifyTokens(draft, spec)
	must(t, err)
	must(t, be.Sync())
	before := held()
	e, err := engine.Load(be, target, opts)
	must(t, err)
	defer e.Close()
	must(t, dflash.Attach(e, draft, spec))
	var reqs []engine.Request
	for i := range plan.MaxRunning.Effective {
		reqs = append(reqs, engine.Request{Prompt: []int32{7, int32(i), 3}, MaxTokens: 16, IgnoreEOS: true})
	}
	enginetest.Batched(t, e, reqs)
	must(t, be.Sync())
	got, planned := held()-before, plan.EngineBytes()
	slack := max(planned/50, 64<<20)
	if d := got - planned; d > slack || -d > slack || planned < 4*slack {
		t.Errorf("device buffers %d bytes after a batch, the plan assigns %d: %+d, want within %d of a plan over %d", got, planned, d, slack, 4*slack)
	}
}

// checkCloseReleases loads a target with a drafter on a BF16 KV cache,
// generates speculatively, closes the engine and checks that the device
// memory held in buffers is back at its level before the load.
func checkCloseReleases(t *testing.T, be kernels.Backend) {
	held := be.(interface{ BufferBytes() int64 }).BufferBytes
	target, draft := tinyBF16Pair(t, 5)
	must(t, be.Sync())
	before := held()
	spec := engine.SpecOptions{Mode: engine.SpecTree, Budget: 8}
	verify, err := dflash.VerifyTokens(draft, spec)
	must(t, err)
	e, err := engine.Load(be, target, engine.Options{Context: 64, MaxSeqs: 2, VerifyTokens: verify, KVDType: kernels.BF16})
	must(t, err)
	must(t, dflash.Attach(e, draft, spec))
	_, err = e.Generate(context.Background(), engine.Request{Prompt: []int32{3, 1, 4, 1, 5}, MaxTokens: 12, IgnoreEOS: true})
	must(t, err)
	loaded := held()
	e.Close()
	must(t, be.Sync())
	if after := held(); after != before || loaded <= before {
		t.Errorf("device buffers: %d bytes before the load, %d loaded, %d after Close: want Close to return to %d", before, loaded, after, before)
	}
}

// checkModelLogits runs a random model of the preset and dtype (bf16, or
// fp8: FP8 linear layers) on be and on the CPU backend: a prefill of the
// prompt, then decode steps, comparing every logit row.
func checkModelLogits(t *testing.T, be kernels.Backend, preset, dtype string) {
	p, err := testmodel.PresetByName(preset)
	must(t, err)
	dir := t.TempDir()
	must(t, testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 1, DType: dtype}))
	rng := rand.New(rand.NewPCG(11, 12))
	prompt := make([]int32, 37)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(250))
	}
	steps := []int32{5, 17, 101, 3}
	want := modelLogits(t, []kernels.Backend{cpu.New(0)}, dir, prompt, steps)
	got := modelLogits(t, []kernels.Backend{be}, dir, prompt, steps)
	for i := range want {
		// F32 activations and exactly widened (FP8: exactly dequantised)
		// weights on both: the difference is accumulation order.
		if d := cuda.RelNorm(got[i], want[i]); d > 1e-4 {
			t.Errorf("%s %s forward %d: ‖got−cpu‖/‖cpu‖ = %.2g", preset, dtype, i, d)
		}
	}
}

// modelLogits loads dir split over ranks (one for no tensor parallelism),
// prefills prompt in one forward (all rows' logits), then feeds steps one
// token at a time; it returns each forward's logits of the real token ids,
// having checked that the padding ids' are -Inf.
func modelLogits(t *testing.T, ranks []kernels.Backend, dir string, prompt, steps []int32) [][]float32 {
	t.Helper()
	e, err := engine.LoadParallel(ranks, dir, engine.Options{PageSize: 16, Context: len(prompt) + len(steps) + 1})
	must(t, err)
	defer e.Close()
	slot, err := e.Model.States.Acquire()
	must(t, err)
	var kv engine.SeqKV
	var out [][]float32
	forward := func(tokens []int32, start int, rows engine.LogitRows) {
		must(t, e.Model.KV.Reserve(&kv, start+len(tokens)))
		res, err := e.Model.Forward([]engine.SeqInput{{Tokens: tokens, Start: start, KV: &kv, Slot: slot, Logits: rows}}, nil)
		must(t, err)
		V, valid := e.Model.Cfg.VocabSize, e.ValidVocab
		var real []float32
		for r := 0; r < len(res[0].Logits); r += V {
			row := res[0].Logits[r : r+V]
			if i := slices.IndexFunc(row[valid:], func(x float32) bool { return !math.IsInf(float64(x), -1) }); i >= 0 {
				t.Fatalf("%s: padding id %d has logit %g, want -Inf", ranks[0].Name(), valid+i, row[valid+i])
			}
			real = append(real, row[:valid]...)
		}
		out = append(out, real)
	}
	forward(prompt, 0, engine.AllRows)
	for i, tok := range steps {
		forward([]int32{tok}, len(prompt)+i, engine.LastRow)
	}
	return out
}

// checkSpecGeneration decodes greedily with a random DFlash drafter in
// linear and DDTree modes on be: the output must equal the CPU backend's
// (greedy speculative decoding reproduces the target's greedy tokens, and
// both backends compute the same logits to F32 rounding).
func checkSpecGeneration(t *testing.T, be kernels.Backend) {
	target, draft := tinyBF16Pair(t, 3)
	prompt := []int32{12, 40, 7, 99, 3, 250, 18}
	// Greedy, then top-k sampling, whose candidates the device's TopK moves.
	sampled := engine.SamplingParams{Temperature: 0.9, TopK: 20, TopP: 0.95, Seed: 4}
	for _, c := range []struct {
		spec     engine.SpecOptions
		sampling engine.SamplingParams
	}{
		{engine.SpecOptions{Mode: engine.SpecLinear}, engine.SamplingParams{}},
		{engine.SpecOptions{Mode: engine.SpecTree, Budget: 8}, engine.SamplingParams{}},
		{engine.SpecOptions{Mode: engine.SpecTree, Budget: 16}, engine.SamplingParams{}},
		{engine.SpecOptions{Mode: engine.SpecTree, Budget: 8}, sampled},
	} {
		t.Run(fmt.Sprintf("%v-%d-T%g", c.spec.Mode, c.spec.Budget, c.sampling.Temperature), func(t *testing.T) {
			want := generate(t, cpu.New(0), target, draft, c.spec, prompt, c.sampling, engine.SSMFromConfig)
			got := generate(t, be, target, draft, c.spec, prompt, c.sampling, engine.SSMFromConfig)
			if !slices.Equal(got, want) {
				t.Errorf("tokens differ from the CPU backend's\n got %v\nwant %v", got, want)
			}
		})
	}
}

// checkSpecLosslessBF16State decodes greedily on be with a BF16 recurrent
// state, autoregressively and with a random DFlash drafter (chains and
// trees, replay and snapshot rollback): every speculative output must equal
// the autoregressive one, since the kernels round the state after every
// token on every path.
func checkSpecLosslessBF16State(t *testing.T, be kernels.Backend) {
	target, draft := tinyBF16Pair(t, 4)
	prompt := []int32{9, 31, 200, 5, 77, 140}
	want := generate(t, be, target, draft, engine.SpecOptions{Mode: engine.SpecAuto}, prompt, engine.SamplingParams{}, engine.SSMBF16)
	for _, spec := range []engine.SpecOptions{
		{Mode: engine.SpecLinear, Rollback: mamba.Replay},
		{Mode: engine.SpecTree, Budget: 8, Rollback: mamba.Replay},
		{Mode: engine.SpecTree, Budget: 8, Rollback: mamba.Snapshot},
	} {
		if got := generate(t, be, target, draft, spec, prompt, engine.SamplingParams{}, engine.SSMBF16); !slices.Equal(got, want) {
			t.Errorf("%v budget %d %v: tokens differ from autoregressive decoding\n got %v\nwant %v", spec.Mode, spec.Budget, spec.Rollback, got, want)
		}
	}
}

// checkDraftLogits drafts with a random drafter in the published
// Qwen3.6-27B layout (4 sliding layers, window 8, then a full one) on be and
// on the CPU backend, in rounds whose context outgrows the sliding layers'
// rings: every round's logits of the real token ids must agree to F32
// rounding.
func checkDraftLogits(t *testing.T, be kernels.Backend) {
	var published struct {
		LayerTypes []string `json:"layer_types"`
	}
	data, err := os.ReadFile("../../dflash/testdata/qwen3.6-27b-dflash.config.subset.json")
	must(t, err)
	must(t, json.Unmarshal(data, &published))
	p, err := testmodel.PresetByName("tiny")
	must(t, err)
	dir := t.TempDir()
	target, draft := dir+"/target", dir+"/draft"
	must(t, testmodel.Write(target, testmodel.Options{Preset: p, Seed: 7, DType: "bf16"}))
	must(t, testmodel.WriteDrafter(draft, testmodel.DraftOptions{Target: p, Seed: 7, DType: "bf16", LayerTypes: published.LayerTypes, Window: 8}))
	cfg, err := dflash.LoadConfig(draft)
	must(t, err)
	width := len(cfg.TargetLayerIDs) * p.Hidden
	rng := rand.New(rand.NewPCG(13, 14))
	var features [][]float32
	for _, rows := range []int{9, 1, 20, 3, 30} {
		f := make([]float32, rows*width)
		for i := range f {
			f[i] = float32(rng.NormFloat64())
		}
		features = append(features, f)
	}
	logits := func(be kernels.Backend) [][]float32 {
		e, err := engine.Load(be, target, engine.Options{PageSize: 4, Context: 128})
		must(t, err)
		defer e.Close()
		d, err := dflash.LoadDrafter(draft, e.Model, dflash.Options{PageSize: 4, Context: e.Context})
		must(t, err)
		defer d.Close()
		s, err := d.NewSession(nil)
		must(t, err)
		defer s.Close()
		// The padding ids' logits are -Inf on both: compare the real ones.
		V, valid := e.Model.Cfg.VocabSize, e.ValidVocab
		var out [][]float32
		for i, f := range features {
			l, err := s.Draft(f, int32(17+i))
			must(t, err)
			out = append(out, validColumns(l, V, valid))
		}
		return out
	}
	checkRounds(t, "draft round", logits(cpu.New(0)), logits(be))
}

// checkDFlash2 runs a random DFlash2 drafter (testmodel's published
// layout, block 8) on be and on the CPU backend: every draft round's unary
// logits and selector scores agree to F32 rounding and the candidates are
// the same (the convolutions run on be, the selector's matrix products and
// gathers on be and its scores on the host); greedy DDTree decoding
// gives autoregressive decoding's tokens.
func checkDFlash2(t *testing.T, be kernels.Backend) {
	target, draft := tinyBF16PairWith(t, 8, testmodel.DraftOptions{BlockSize: 8, Window: 8, DFlash2: true})
	cfg, err := dflash.LoadConfig(draft)
	must(t, err)
	p, err := testmodel.PresetByName("tiny")
	must(t, err)
	width := len(cfg.TargetLayerIDs) * p.Hidden
	rng := rand.New(rand.NewPCG(15, 16))
	var features [][]float32
	for _, rows := range []int{9, 1, 12} {
		f := make([]float32, rows*width)
		for i := range f {
			f[i] = float32(rng.NormFloat64())
		}
		features = append(features, f)
	}
	type round struct {
		logits, scores []float32
		candidates     [][]int32
	}
	draftRounds := func(be kernels.Backend) []round {
		e, err := engine.Load(be, target, engine.Options{PageSize: 4, Context: 128})
		must(t, err)
		defer e.Close()
		d, err := dflash.LoadDrafter(draft, e.Model, dflash.Options{PageSize: 4, Context: e.Context})
		must(t, err)
		defer d.Close()
		s, err := d.NewSession(nil)
		must(t, err)
		defer s.Close()
		V, valid := e.Model.Cfg.VocabSize, e.ValidVocab
		var out []round
		for i, f := range features {
			l, err := s.Draft(f, int32(23+i))
			must(t, err)
			var r round
			for row := 0; row < len(l); row += V {
				r.logits = append(r.logits, l[row:row+valid]...)
			}
			lattice := s.(engine.LatticeSession).Lattice()
			r.candidates = lattice.Tokens
			for _, rows := range lattice.Scores {
				for _, scores := range rows {
					for _, v := range scores {
						r.scores = append(r.scores, float32(v))
					}
				}
			}
			out = append(out, r)
		}
		return out
	}
	want, got := draftRounds(cpu.New(0)), draftRounds(be)
	for i := range want {
		if d := cuda.RelNorm(got[i].logits, want[i].logits); d > 1e-4 {
			t.Errorf("draft round %d: unary logits ‖got−cpu‖/‖cpu‖ = %.2g", i, d)
		}
		if !reflect.DeepEqual(got[i].candidates, want[i].candidates) {
			t.Errorf("draft round %d: candidates %v, the CPU backend's %v", i, got[i].candidates, want[i].candidates)
		} else if d := cuda.RelNorm(got[i].scores, want[i].scores); d > 1e-4 {
			t.Errorf("draft round %d: selector scores ‖got−cpu‖/‖cpu‖ = %.2g", i, d)
		}
	}
	prompt := []int32{30, 8, 211, 64, 5}
	auto := generate(t, cpu.New(0), target, draft, engine.SpecOptions{Mode: engine.SpecAuto}, prompt, engine.SamplingParams{}, engine.SSMFromConfig)
	// A chain-seeded tree: the greedy walk and the best-first lattice tree
	// (the backend work is the same as linear decoding's).
	tree := engine.SpecOptions{Mode: engine.SpecTree, Budget: 8}
	if got := generate(t, be, target, draft, tree, prompt, engine.SamplingParams{}, engine.SSMFromConfig); !slices.Equal(got, auto) {
		t.Errorf("DFlash2 DDTree: tokens differ from autoregressive decoding\n got %v\nwant %v", got, auto)
	}
}

// checkMTP drafts with a random MTP head (the target's mtp.*) on be and on
// the CPU backend in rounds of committed rows, comparing every step's
// logits of the real token ids, then decodes with it greedily as a chain
// and as a DDTree: the output must equal autoregressive decoding on be.
func checkMTP(t *testing.T, be kernels.Backend) {
	p, err := testmodel.PresetByName("tiny")
	must(t, err)
	target := t.TempDir()
	must(t, testmodel.Write(target, testmodel.Options{Preset: p, Seed: 8, DType: "bf16", MTP: true}))
	rng := rand.New(rand.NewPCG(15, 16))
	tokens := make([]int32, 50)
	for i := range tokens {
		tokens[i] = int32(rng.IntN(250))
	}
	const steps = 4
	logits := func(be kernels.Backend) [][]float32 {
		e, err := engine.Load(be, target, engine.Options{PageSize: 4, Context: 128, VerifyTokens: steps + 1})
		must(t, err)
		defer e.Close()
		must(t, mtp.Attach(e, target, steps, engine.SpecOptions{Mode: engine.SpecLinear}))
		d := e.Drafter.(*mtp.Drafter)
		slot, err := e.Model.States.Acquire()
		must(t, err)
		var kv engine.SeqKV
		must(t, e.Model.KV.Reserve(&kv, len(tokens)))
		res, err := e.Model.Forward([]engine.SeqInput{{Tokens: tokens, KV: &kv, Slot: slot, Logits: engine.NoRows}}, d.TapLayers())
		must(t, err)
		features := slices.Clone(res[0].Features)
		s, err := d.NewSession(nil)
		must(t, err)
		defer s.Close()
		V, valid, H := e.Model.Cfg.VocabSize, e.ValidVocab, p.Hidden
		var out [][]float32
		done := 0
		for _, rows := range []int{9, 1, 20, 3, 16} {
			next := int32(17)
			if done+rows < len(tokens) {
				next = tokens[done+rows]
			}
			l, err := s.(engine.TokenDraftSession).DraftTokens(features[done*H:(done+rows)*H], tokens[done:done+rows], next)
			must(t, err)
			done += rows
			out = append(out, validColumns(l, V, valid))
		}
		return out
	}
	checkRounds(t, "MTP draft round", logits(cpu.New(0)), logits(be))
	prompt := []int32{12, 40, 7, 99, 3, 250, 18}
	decode := func(spec engine.SpecOptions) []int32 {
		e, err := engine.Load(be, target, engine.Options{Context: 64, VerifyTokens: spec.VerifyTokens(steps + 1)})
		must(t, err)
		defer e.Close()
		if spec.Mode != engine.SpecAuto {
			must(t, mtp.Attach(e, target, steps, spec))
		}
		res, err := e.Generate(context.Background(), engine.Request{Prompt: prompt, MaxTokens: 24, IgnoreEOS: true})
		must(t, err)
		return res.Tokens
	}
	ar := decode(engine.SpecOptions{})
	for _, spec := range []engine.SpecOptions{{Mode: engine.SpecLinear}, {Mode: engine.SpecTree, Budget: 8, Rollback: mamba.Snapshot}} {
		if got := decode(spec); !slices.Equal(got, ar) {
			t.Errorf("MTP %v: tokens differ from autoregressive decoding\n got %v\nwant %v", spec.Mode, got, ar)
		}
	}
}

// tinyBF16Pair writes a random bf16 tiny target of seed and its drafter.
func tinyBF16Pair(t *testing.T, seed uint64) (target, draft string) {
	return tinyBF16PairWith(t, seed, testmodel.DraftOptions{})
}

// tinyBF16PairWith is tinyBF16Pair with drafter options (target, seed and
// dtype are set here).
func tinyBF16PairWith(t *testing.T, seed uint64, opts testmodel.DraftOptions) (target, draft string) {
	p, err := testmodel.PresetByName("tiny")
	must(t, err)
	dir := t.TempDir()
	target, draft = dir+"/target", dir+"/draft"
	must(t, testmodel.Write(target, testmodel.Options{Preset: p, Seed: seed, DType: "bf16"}))
	opts.Target, opts.Seed, opts.DType = p, seed, "bf16"
	must(t, testmodel.WriteDrafter(draft, opts))
	return target, draft
}

// generate decodes on be with the given sampling, with the drafter unless
// spec is SpecAuto.
func generate(t *testing.T, be kernels.Backend, target, draft string, spec engine.SpecOptions, prompt []int32, sampling engine.SamplingParams, ssm engine.SSMDType) []int32 {
	t.Helper()
	const maxTokens = 24
	opts := engine.Options{Context: len(prompt) + maxTokens + 1, SSMDType: ssm}
	var err error
	if spec.Mode != engine.SpecAuto {
		opts.VerifyTokens, err = dflash.VerifyTokens(draft, spec)
		must(t, err)
	}
	e, err := engine.Load(be, target, opts)
	must(t, err)
	defer e.Close()
	if spec.Mode != engine.SpecAuto {
		must(t, dflash.Attach(e, draft, spec))
	}
	res, err := e.Generate(context.Background(), engine.Request{Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true, Sampling: sampling})
	must(t, err)
	return res.Tokens
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// validColumns cuts each row of l ([rows, V] logits) to its first valid
// ids: the padding ids' logits are -Inf on every backend.
func validColumns(l []float32, V, valid int) []float32 {
	var real []float32
	for r := 0; r < len(l); r += V {
		real = append(real, l[r:r+valid]...)
	}
	return real
}

// checkRounds compares each round's logits with the CPU backend's: F32
// activations on both, so they differ by accumulation order only.
func checkRounds(t *testing.T, what string, want, got [][]float32) {
	t.Helper()
	for i := range want {
		if d := cuda.RelNorm(got[i], want[i]); d > 1e-4 {
			t.Errorf("%s %d: ‖got−cpu‖/‖cpu‖ = %.2g", what, i, d)
		}
	}
}
