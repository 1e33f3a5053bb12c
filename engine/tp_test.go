package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"ddflash/engine/config"
	"ddflash/engine/testmodel"
	"ddflash/internal/closeness"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/mamba"
)

// writeTestModel writes a preset checkpoint and returns its directory.
func writeTestModel(t testing.TB, preset string, seed uint64, dtype string) string {
	t.Helper()
	p, err := testmodel.PresetByName(preset)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: seed, DType: dtype}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// loadTP loads dir split over tp CPU ranks of one thread each.
func loadTP(t testing.TB, dir string, tp int, opts Options) *Engine {
	t.Helper()
	backends := make([]kernels.Backend, tp)
	for i := range backends {
		backends[i] = cpu.New(1)
	}
	e, err := LoadParallel(backends, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// tpCases are the checkpoints and degrees compared with one rank: tiny splits
// its 2 KV heads over 2 ranks; tp8 also replicates them over 4 and 8;
// tp8-h256 does so with Qwen3.6's head dims and 3 GDN value heads per key head.
var tpCases = []struct {
	preset, dtype string
	tp            int
}{
	{"tiny", "f32", 2},
	{"tp8", "bf16", 2},
	{"tp8", "f32", 4},
	{"tp8", "bf16", 8},
	{"tp8-h256", "bf16", 2},
	{"tp8-h256", "f32", 8},
}

// TestTensorParallelLogits: a prefill with logits for every row and tapped
// hidden states, then decode steps, agree with one rank to fp32 rounding
// (all-reduce changes only the order of the partial sums).
func TestTensorParallelLogits(t *testing.T) {
	for _, c := range tpCases {
		t.Run(fmt.Sprintf("%s-%s-tp%d", c.preset, c.dtype, c.tp), func(t *testing.T) {
			dir := writeTestModel(t, c.preset, 7, c.dtype)
			rng := rand.New(rand.NewPCG(uint64(c.tp), 5))
			prompt, steps := randomTokens(rng, 23, 290), randomTokens(rng, 5, 290)
			taps := []int{1, 3}
			run := func(e *Engine) (logits, features []float32) {
				s, err := e.newSequence()
				if err != nil {
					t.Fatal(err)
				}
				out, err := e.forward(s, SeqInput{Tokens: prompt, Logits: AllRows}, taps)
				if err != nil {
					t.Fatal(err)
				}
				if want := len(prompt) * len(taps) * e.Model.Cfg.HiddenSize; len(out.Features) != want {
					t.Fatalf("%d feature values, want %d", len(out.Features), want)
				}
				logits, features = out.Logits, slices.Clone(out.Features)
				for _, tok := range steps {
					l, err := e.step(s, tok)
					if err != nil {
						t.Fatal(err)
					}
					logits = append(logits, l...)
				}
				return logits, features
			}
			want, wantFeatures := run(loadTP(t, dir, 1, Options{Context: 64}))
			got, gotFeatures := run(loadTP(t, dir, c.tp, Options{Context: 64}))
			if d, scale := maxAbsDiff(got, want), closeness.Scale(want); d > 2e-5*scale {
				t.Errorf("logits differ from one rank by %.3g (scale %.3g)", d, scale)
			}
			if d, scale := maxAbsDiff(gotFeatures, wantFeatures), closeness.Scale(wantFeatures); d > 2e-5*scale {
				t.Errorf("tapped hidden states differ from one rank by %.3g (scale %.3g)", d, scale)
			}
		})
	}
}

// TestTensorParallelGreedyEveryMode: greedy output under tensor parallelism
// equals one rank's autoregressive output, autoregressively and in every
// speculative mode (oracle drafts with noise, so every acceptance length
// and tree shape occurs), with both rollback strategies; sampled output
// with a seed matches too.
func TestTensorParallelGreedyEveryMode(t *testing.T) {
	modes := []specCase{
		{SpecAuto, 0, mamba.Replay},
		{SpecLinear, 0, mamba.Replay}, {SpecLinear, 0, mamba.Snapshot},
		{SpecTree, 8, mamba.Snapshot}, {SpecTree, 32, mamba.Replay},
	}
	for _, c := range tpCases {
		t.Run(fmt.Sprintf("%s-%s-tp%d", c.preset, c.dtype, c.tp), func(t *testing.T) {
			dir := writeTestModel(t, c.preset, 9, c.dtype)
			rng := rand.New(rand.NewPCG(uint64(c.tp), 6))
			const ctxLen = 96
			for _, req := range []Request{
				{Prompt: randomTokens(rng, 9, 290), MaxTokens: 48},
				{Prompt: randomTokens(rng, 4, 290), MaxTokens: 32, Sampling: SamplingParams{Temperature: 0.8, Seed: 3}},
			} {
				want, err := loadTP(t, dir, 1, Options{Context: ctxLen}).Generate(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range modes {
					e := loadTP(t, dir, c.tp, Options{Context: ctxLen, PageSize: 4, VerifyTokens: 33})
					if m.mode != SpecAuto {
						e.Spec = SpecOptions{Mode: m.mode, Budget: m.budget, Rollback: m.rollback}
						e.Drafter = pathDrafter(e, concat(req.Prompt, want.Tokens))
					}
					got, err := e.Generate(context.Background(), req)
					if err != nil {
						t.Fatalf("%v: %v", m, err)
					}
					if !slices.Equal(got.Tokens, want.Tokens) {
						t.Fatalf("%v at T=%g: TP %d output differs from one rank\n got %v\nwant %v", m, req.Sampling.Temperature, c.tp, got.Tokens, want.Tokens)
					}
					if m.mode != SpecAuto && got.Stats.AcceptanceLength <= 1.5 {
						t.Fatalf("%v: τ %.2f: oracle drafts were hardly accepted, the test does not exercise rollback", m, got.Stats.AcceptanceLength)
					}
				}
			}
		})
	}
}

// TestTensorParallelCacheShares: each rank's KV cache, GDN state slots and
// weight slices hold exactly its share: heads divided by TP, KV heads divided
// or (below TP) one replicated head, the vocabulary divided for the LM head.
func TestTensorParallelCacheShares(t *testing.T) {
	for _, c := range tpCases {
		t.Run(fmt.Sprintf("%s-tp%d", c.preset, c.tp), func(t *testing.T) {
			dir := writeTestModel(t, c.preset, 1, c.dtype)
			const pageSize, pages, slots = 4, 10, 3
			e := loadTP(t, dir, c.tp, Options{PageSize: pageSize, KVTokens: pageSize * pages, MaxSeqs: slots})
			cfg := e.Model.Cfg
			kvHeads := cfg.NumKVHeads / c.tp
			if cfg.NumKVHeads < c.tp {
				kvHeads = 1
			}
			for r := range c.tp {
				k, v := e.Model.KV.Layer(r, 0)
				want := pageSize * pages * kvHeads * cfg.HeadDim
				if k.Len() != want || v.Len() != want {
					t.Errorf("rank %d: KV layer buffers hold %d and %d values, want %d", r, k.Len(), v.Len(), want)
				}
				conv := e.Model.States.Conv(r, 0, slots-1)
				if want := (cfg.ConvKernel - 1) * cfg.ConvDim() / c.tp; conv.Len() != want {
					t.Errorf("rank %d: conv state of a slot holds %d values, want %d", r, conv.Len(), want)
				}
				ssm := e.Model.States.SSM(r, 0, slots-1)
				if want := cfg.LinearValueHeads / c.tp * cfg.LinearKeyDim * cfg.LinearValueDim; ssm.Len() != want {
					t.Errorf("rank %d: recurrent state of a slot holds %d values, want %d", r, ssm.Len(), want)
				}
				w := e.Model.ranks[r].w
				if want := cfg.VocabSize / c.tp * cfg.HiddenSize; w.LMHead.Len() != want {
					t.Errorf("rank %d: LM head holds %d values, want %d", r, w.LMHead.Len(), want)
				}
				if want := cfg.VocabSize * cfg.HiddenSize; w.Embed.Len() != want {
					t.Errorf("rank %d: embedding holds %d values, want the whole %d", r, w.Embed.Len(), want)
				}
				l := w.Layers[0] // a GDN layer
				if want := cfg.ConvDim() / c.tp * cfg.HiddenSize; l.InProjQKV.Len() != want {
					t.Errorf("rank %d: in_proj_qkv holds %d values, want %d", r, l.InProjQKV.Len(), want)
				}
				if want := cfg.HiddenSize * cfg.IntermediateSize / c.tp; l.Down.Len() != want {
					t.Errorf("rank %d: down_proj holds %d values, want %d", r, l.Down.Len(), want)
				}
			}
		})
	}
}

// TestSplitConfigErrors: degrees that do not divide the model fail with
// every dimension named.
func TestSplitConfigErrors(t *testing.T) {
	base := config.Config{NumHeads: 8, NumKVHeads: 2, LinearKeyHeads: 4, LinearValueHeads: 8, IntermediateSize: 100, VocabSize: 320}
	cases := []struct {
		tp   int
		want []string
	}{
		{1, nil},
		{2, nil},
		{4, nil}, // KV heads replicated
		{8, []string{"4 GDN key heads", "100 MLP intermediate size"}},
		{3, []string{"8 attention heads", "2 KV heads", "4 GDN key heads", "8 GDN value heads", "100 MLP intermediate size", "320 vocabulary rows"}},
		{16, []string{"8 attention heads", "4 GDN key heads", "8 GDN value heads"}}, // KV heads replicated
		{0, []string{"want at least 1"}},
	}
	for _, c := range cases {
		rc, err := splitConfig(&base, c.tp)
		if c.want == nil {
			if err != nil {
				t.Errorf("tp %d: %v", c.tp, err)
			} else if rc.NumHeads*c.tp != base.NumHeads || rc.IntermediateSize*c.tp != base.IntermediateSize {
				t.Errorf("tp %d: rank config %+v", c.tp, rc)
			}
			continue
		}
		if err == nil {
			t.Errorf("tp %d: no error", c.tp)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("tp %d: error %q does not name %q", c.tp, err, w)
			}
		}
	}
}

// TestLocalComm: all-reduce sums in rank order with bit-identical results on
// every rank; all-gather and broadcast place every value, over several
// collectives in a row.
func TestLocalComm(t *testing.T) {
	const ranks, n = 3, 37
	backends := make([]kernels.Backend, ranks)
	for i := range backends {
		backends[i] = cpu.New(1)
	}
	comm := NewLocalComm(backends)
	rng := rand.New(rand.NewPCG(4, 4))
	inputs := make([][]float32, ranks)
	for r := range inputs {
		inputs[r] = make([]float32, n)
		for i := range inputs[r] {
			inputs[r][i] = float32(rng.NormFloat64())
		}
	}
	wantSum := make([]float32, n)
	for i := range wantSum {
		wantSum[i] = (inputs[0][i] + inputs[1][i]) + inputs[2][i]
	}
	results := make([][3][]float32, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() {
			b := backends[r]
			buf, _ := b.Alloc(kernels.F32, n)
			gathered, _ := b.Alloc(kernels.F32, ranks*n)
			check := func(err error) {
				if err != nil {
					t.Error(err)
				}
			}
			check(b.UploadF32(buf, 0, inputs[r]))
			check(comm.AllGather(r, gathered, buf, n))
			check(comm.AllReduceSum(r, buf, n))
			sum := make([]float32, n)
			check(b.DownloadF32(buf, 0, sum))
			all := make([]float32, ranks*n)
			check(b.DownloadF32(gathered, 0, all))
			check(b.UploadF32(buf, 0, inputs[r]))
			check(comm.Broadcast(r, 2, buf, n))
			bc := make([]float32, n)
			check(b.DownloadF32(buf, 0, bc))
			results[r] = [3][]float32{sum, all, bc}
		})
	}
	wg.Wait()
	for r, res := range results {
		if !slices.Equal(res[0], wantSum) {
			t.Errorf("rank %d: all-reduce %v, want %v", r, res[0][:3], wantSum[:3])
		}
		if !slices.Equal(res[1], slices.Concat(inputs...)) {
			t.Errorf("rank %d: all-gather differs", r)
		}
		if !slices.Equal(res[2], inputs[2]) {
			t.Errorf("rank %d: broadcast from rank 2 differs", r)
		}
	}
}

// connectingBackend is a CPU backend that connects its ranks itself, as GPUs
// do through NCCL: with a LocalComm that counts the all-reduces, or not at all.
type connectingBackend struct {
	kernels.Backend
	refuse     error
	allReduces *atomic.Int64
}

func (b connectingBackend) Connect(ranks []kernels.Backend) (kernels.Comm, error) {
	if b.refuse != nil {
		return nil, b.refuse
	}
	return countingComm{NewLocalComm(ranks), b.allReduces}, nil
}

type countingComm struct {
	*LocalComm
	allReduces *atomic.Int64
}

func (c countingComm) AllReduceSum(rank int, buf kernels.Buffer, n int) error {
	c.allReduces.Add(1)
	return c.LocalComm.AllReduceSum(rank, buf, n)
}

// TestTensorParallelConnector: ranks whose backend brings its own
// communicator meet in it, and when it cannot connect them, loading fails
// with its reason instead of falling back to copies through host memory.
func TestTensorParallelConnector(t *testing.T) {
	dir := writeTestModel(t, "tiny", 3, "f32")
	ranks := func(refuse error, allReduces *atomic.Int64) []kernels.Backend {
		r := make([]kernels.Backend, 2)
		for i := range r {
			r[i] = connectingBackend{cpu.New(1), refuse, allReduces}
		}
		return r
	}
	var count atomic.Int64
	e, err := LoadParallel(ranks(nil, &count), dir, Options{Context: 32})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Generate(context.Background(), Request{Prompt: []int32{1, 2, 3}, MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	if count.Load() == 0 {
		t.Error("the backends' communicator did no all-reduce: the ranks met elsewhere")
	}
	refusal := errors.New("libnccl.so.2 not found")
	if _, err := LoadParallel(ranks(refusal, nil), dir, Options{Context: 32}); !errors.Is(err, refusal) || !strings.Contains(err.Error(), "tensor parallelism over 2 ranks") {
		t.Errorf("loading over ranks that cannot connect: error %v, want the refusal %q", err, refusal)
	}
}
