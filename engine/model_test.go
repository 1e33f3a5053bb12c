package engine

import (
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/engine/testmodel"
	"ddflash/internal/closeness"
	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// newTestEngine writes a random checkpoint of the preset and loads it.
func newTestEngine(t testing.TB, preset string, seed uint64, opts Options) *Engine {
	t.Helper()
	return newTestEngineOn(t, cpu.New(2), preset, seed, opts)
}

// newTestEngineOn loads a random model of the preset on backend b.
func newTestEngineOn(t testing.TB, b kernels.Backend, preset string, seed uint64, opts Options) *Engine {
	t.Helper()
	p, err := testmodel.PresetByName(preset)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: seed, DType: "f32"}); err != nil {
		t.Fatal(err)
	}
	e, err := Load(b, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func randomTokens(rng *rand.Rand, n, vocab int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(rng.IntN(vocab))
	}
	return out
}

// maxAbsDiff is the largest element difference, +Inf on NaN or Inf.
func maxAbsDiff(a, b []float32) float64 { return closeness.MaxAbsDiff(a, b) }

// stateOf downloads every GDN layer's conv and recurrent state of a slot,
// rank by rank.
func stateOf(t testing.TB, e *Engine, slot int) []float32 {
	t.Helper()
	p := e.Model.States
	var out []float32
	for r := range p.Ranks() {
		sh := p.Shard(r)
		for l := 0; l < sh.Shape.Layers; l++ {
			conv := make([]float32, p.Conv(r, l, slot).Len())
			ssm := make([]float32, p.SSM(r, l, slot).Len())
			if err := sh.B.DownloadF32(p.Conv(r, l, slot), 0, conv); err != nil {
				t.Fatal(err)
			}
			if err := sh.B.DownloadF32(p.SSM(r, l, slot), 0, ssm); err != nil {
				t.Fatal(err)
			}
			out = append(append(out, conv...), ssm...)
		}
	}
	return out
}

// TestPrefillEqualsTokenByToken checks that one prefill forward (chunked GDN
// form and multi-row attention) equals feeding the tokens one at a time with
// carried KV, conv and recurrent state.
func TestPrefillEqualsTokenByToken(t *testing.T) {
	for _, preset := range []string{"tiny", "tiny-h256"} {
		t.Run(preset, func(t *testing.T) { checkPrefillEqualsTokenByToken(t, preset) })
	}
}

func checkPrefillEqualsTokenByToken(t *testing.T, preset string) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 9, 80, 150} { // 80 and 150 take the chunked GDN path
		whole := newTestEngine(t, preset, 3, Options{PrefillChunk: 1 << 20})
		steps := newTestEngine(t, preset, 3, Options{})
		prompt := randomTokens(rng, n, whole.ValidVocab)

		a, err := whole.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := whole.prefill(a, prompt, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := steps.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		var want []float32
		for _, tok := range prompt {
			if want, err = steps.step(b, tok); err != nil {
				t.Fatal(err)
			}
		}
		if d := maxAbsDiff(got, want); d > 1e-4 {
			t.Errorf("n=%d: last-position logits differ by %g (bound 1e-4)", n, d)
		}
		if d := maxAbsDiff(stateOf(t, whole, a.slot), stateOf(t, steps, b.slot)); d > 1e-4 {
			t.Errorf("n=%d: GDN states differ by %g (bound 1e-4)", n, d)
		}
	}
}

// TestBatchEqualsAlone runs sequences of different lengths (some with cached
// context) in one forward and compares every row's logits with running each alone.
func TestBatchEqualsAlone(t *testing.T) {
	for _, preset := range []string{"tiny", "tiny-h256"} {
		t.Run(preset, func(t *testing.T) { checkBatchEqualsAlone(t, preset) })
	}
}

func checkBatchEqualsAlone(t *testing.T, preset string) {
	rng := rand.New(rand.NewPCG(5, 6))
	type job struct{ context, fresh []int32 }
	jobs := []job{
		{nil, randomTokens(rng, 5, 290)},
		{randomTokens(rng, 11, 290), randomTokens(rng, 17, 290)},
		{randomTokens(rng, 3, 290), randomTokens(rng, 1, 290)},
		{nil, randomTokens(rng, 70, 290)},
	}
	batched := newTestEngine(t, preset, 9, Options{MaxSeqs: len(jobs), PageSize: 4})
	var inputs []SeqInput
	for _, j := range jobs {
		s, err := batched.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		if len(j.context) > 0 {
			if _, _, err := batched.prefill(s, j.context, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := batched.Model.KV.Reserve(&s.kv, s.len+len(j.fresh)); err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, SeqInput{Tokens: j.fresh, Start: s.len, KV: &s.kv, Slot: s.slot, Logits: AllRows})
	}
	outs, err := batched.Model.Forward(inputs, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, j := range jobs {
		alone := newTestEngine(t, preset, 9, Options{PageSize: 16})
		s, err := alone.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		if len(j.context) > 0 {
			if _, _, err := alone.prefill(s, j.context, nil); err != nil {
				t.Fatal(err)
			}
		}
		want, err := alone.forward(s, SeqInput{Tokens: j.fresh, Logits: AllRows}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d := maxAbsDiff(outs[i].Logits, want.Logits); d > 1e-5 {
			t.Errorf("sequence %d: batched logits differ from alone by %g (bound 1e-5)", i, d)
		}
	}
}

// TestHiddenTapsLayout checks the taps' layout: in a batch of two
// sequences, each sequence's features are its rows, each row the tapped
// layers in the order asked for, bit-identical to each layer tapped alone
// in a forward of the sequence alone; and a bad tap is refused. Their
// values are checked against the float64 reference in the golden test.
func TestHiddenTapsLayout(t *testing.T) {
	tokens := [][]int32{{5, 6, 7}, {8, 9}}
	e := newTestEngine(t, "tiny", 4, Options{})
	H := e.Model.Cfg.HiddenSize
	taps := []int{e.Model.Cfg.NumLayers - 1, 0}
	forward := func(seqs [][]int32, taps []int) [][]float32 {
		e := newTestEngine(t, "tiny", 4, Options{MaxSeqs: 2})
		var inputs []SeqInput
		for _, toks := range seqs {
			s, err := e.newSequence()
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Model.KV.Reserve(&s.kv, len(toks)); err != nil {
				t.Fatal(err)
			}
			inputs = append(inputs, SeqInput{Tokens: toks, KV: &s.kv, Slot: s.slot, Logits: LastRow})
		}
		outs, err := e.Model.Forward(inputs, taps)
		if err != nil {
			t.Fatal(err)
		}
		var features [][]float32
		for _, o := range outs {
			features = append(features, o.Features)
		}
		return features
	}
	batched := forward(tokens, taps)
	for i, toks := range tokens {
		if got, want := len(batched[i]), len(toks)*len(taps)*H; got != want {
			t.Fatalf("sequence %d: %d feature values, want %d", i, got, want)
		}
		for k, l := range taps {
			alone := forward([][]int32{toks}, []int{l})[0]
			for r := range toks {
				if got, want := batched[i][(r*len(taps)+k)*H:][:H], alone[r*H:][:H]; !slices.Equal(got, want) {
					t.Fatalf("sequence %d row %d: tap of layer %d differs from the layer tapped alone", i, r, l)
				}
			}
		}
	}
	s, err := e.newSequence()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Model.KV.Reserve(&s.kv, len(tokens[0])); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Model.Forward([]SeqInput{{Tokens: tokens[0], KV: &s.kv, Slot: s.slot}}, []int{99}); err == nil {
		t.Fatal("tap of a layer that does not exist was accepted")
	}
}
