package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/mamba"
)

// oracleDrafter proposes next(context) for each position, with each proposed
// token replaced by a random one with probability noise, so every acceptance
// length occurs. Its logits put the proposal first and random tokens after
// it, so trees get real alternatives.
type oracleDrafter struct {
	next   func(context []int32) int32
	block  int
	vocab  int // logits row width
	valid  int // real token ids
	hidden int // target hidden size, to count feature rows
	noise  float64
	rng    *rand.Rand
	taps   []int
	drafts int // Draft calls
}

func (o *oracleDrafter) TapLayers() []int { return o.taps }
func (o *oracleDrafter) BlockSize() int   { return o.block }
func (o *oracleDrafter) NewSession(prompt []int32) (DraftSession, error) {
	return &oracleSession{o: o, prompt: prompt}, nil
}

type oracleSession struct {
	o        *oracleDrafter
	prompt   []int32
	ctx      []int32 // committed tokens
	proposed []int32 // last round's anchor and drafts
}

func (s *oracleSession) Close() {}

// Draft reconstructs the committed context from how many feature rows
// arrived (the prompt first, or the accepted prefix of its own proposal,
// then any autoregressive steps).
func (s *oracleSession) Draft(features []float32, anchor int32) ([]float32, error) {
	o := s.o
	o.drafts++
	rows := len(features) / (len(o.taps) * o.hidden)
	var n int
	if s.proposed == nil {
		s.ctx, n = append(s.ctx, s.prompt...), len(s.prompt)
	} else {
		n = min(rows, len(s.proposed))
		s.ctx = append(s.ctx, s.proposed[:n]...)
	}
	// More rows are autoregressive steps (an adaptive policy skipped
	// drafts): the target's own tokens, which the oracle knows.
	for range rows - n {
		s.ctx = append(s.ctx, o.next(s.ctx))
	}
	V := o.vocab
	logits := make([]float32, (o.block-1)*V)
	s.proposed = []int32{anchor}
	seq := append(append([]int32{}, s.ctx...), anchor)
	for i := 0; i < o.block-1; i++ {
		tok := o.next(seq)
		if o.rng.Float64() < o.noise {
			tok = int32(o.rng.IntN(o.valid))
		}
		row := logits[i*V : (i+1)*V]
		for j := range row {
			row[j] = float32(o.rng.Float64())
		}
		row[tok] = 10
		s.proposed = append(s.proposed, tok)
		seq = append(seq, tok)
	}
	return logits, nil
}

// greedyOracle returns the target's greedy continuation of a context,
// computed on a separate copy of the target and remembered.
func greedyOracle(t testing.TB, ref *Engine) func([]int32) int32 {
	memo := map[string]int32{}
	return func(seq []int32) int32 {
		if len(seq) >= ref.Context {
			return 0
		}
		key := fmt.Sprint(seq)
		if tok, ok := memo[key]; ok {
			return tok
		}
		s, err := ref.newSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer ref.release(s)
		logits, _, err := ref.prefill(s, seq, nil)
		if err != nil {
			t.Fatal(err)
		}
		tok := int32(Argmax(logits[:ref.ValidVocab]))
		memo[key] = tok
		return tok
	}
}

// pathOracle knows the autoregressive answers (each a prompt followed by its
// output): on such a path the continuation is the next answer token. Off
// every path (after a rejected draft) any proposal is rejected anyway.
func pathOracle(answers ...[]int32) func([]int32) int32 {
	return func(seq []int32) int32 {
		for _, full := range answers {
			if len(seq) < len(full) && slices.Equal(seq, full[:len(seq)]) {
				return full[len(seq)]
			}
		}
		return 0
	}
}

func concat(a, b []int32) []int32 { return append(append([]int32{}, a...), b...) }

// pathDrafter is an oracle drafter for e that proposes the continuation of
// path (the prompt and the expected output), with 30% of its proposals
// replaced by random tokens.
func pathDrafter(e *Engine, path []int32) *oracleDrafter {
	return &oracleDrafter{
		next: pathOracle(path), block: 16, vocab: e.Model.Cfg.VocabSize,
		valid: e.ValidVocab, hidden: e.Model.Cfg.HiddenSize, noise: 0.3,
		rng: rand.New(rand.NewPCG(1, 2)), taps: []int{1, 3},
	}
}

// specCase is one speculative configuration to compare with autoregressive decoding.
type specCase struct {
	mode     SpecMode
	budget   int
	rollback mamba.Strategy
}

func (c specCase) String() string {
	if c.mode == SpecTree {
		return fmt.Sprintf("ddtree-b%d-%v", c.budget, c.rollback)
	}
	return fmt.Sprintf("%v-%v", c.mode, c.rollback)
}

func allSpecCases() []specCase {
	cases := []specCase{{SpecLinear, 0, mamba.Replay}, {SpecLinear, 0, mamba.Snapshot}}
	for i, b := range []int{1, 2, 4, 8, 12, 15, 16, 32, 64} {
		cases = append(cases, specCase{SpecTree, b, []mamba.Strategy{mamba.Replay, mamba.Snapshot}[i%2]})
	}
	return cases
}

// specEngine loads the tiny target of seed with an oracle drafter.
func specEngine(t *testing.T, seed uint64, c specCase, next func([]int32) int32, noise float64, ctxLen int) *Engine {
	return specEngineBlock(t, specTarget(seed), seed, c, next, noise, ctxLen, 16, Options{})
}

// specTarget is the target preset of specEngine with this seed: even seeds
// take tiny-h256, with Qwen3.6's head dims and GDN key:value ratio 3.
func specTarget(seed uint64) string {
	if seed%2 == 0 {
		return "tiny-h256"
	}
	return "tiny"
}

// specEngineBlock is specEngine on the preset with a drafter block of the given size.
// opts may ask for more sequences; context, page size and verify room are set here.
func specEngineBlock(t *testing.T, preset string, seed uint64, c specCase, next func([]int32) int32, noise float64, ctxLen, block int, opts Options) *Engine {
	opts.Context, opts.PageSize, opts.VerifyTokens = ctxLen, 4, 65
	e := newTestEngine(t, preset, seed, opts)
	setOracleDrafter(e, seed, c, next, noise, block)
	return e
}

// setOracleDrafter switches e to speculative decoding in mode c with an
// oracle drafter of the given block size.
func setOracleDrafter(e *Engine, seed uint64, c specCase, next func([]int32) int32, noise float64, block int) {
	e.Spec = SpecOptions{Mode: c.mode, Budget: c.budget, Rollback: c.rollback}
	e.Drafter = &oracleDrafter{
		next: next, block: block, vocab: e.Model.Cfg.VocabSize, valid: e.ValidVocab,
		hidden: e.Model.Cfg.HiddenSize, noise: noise, rng: rand.New(rand.NewPCG(seed, 99)), taps: []int{e.Model.Cfg.NumLayers / 4, e.Model.Cfg.NumLayers - 1},
	}
}

// TestSpecGreedyIsLossless compares every spec mode with autoregressive
// decoding on random targets and prompts: a one-token prompt, ordinary
// prompts, a prompt near the context limit, max tokens inside a block, an
// end-of-sequence token inside a block, drafts from perfect to useless, and
// seeded sampling.
func TestSpecGreedyIsLossless(t *testing.T) {
	const ctxLen = 64
	rng := rand.New(rand.NewPCG(77, 78))
	type job struct {
		prompt    []int32
		maxTokens int
		eosAt     int // index of the AR output whose token becomes EOS; -1 none
		noise     float64
		temp      float64 // > 0 samples (seeded)
	}
	jobs := []job{
		{randomTokens(rng, 1, 290), 40, -1, 0, 0},
		{randomTokens(rng, 7, 290), 37, 20, 0.2, 0},
		{randomTokens(rng, 12, 290), 9, -1, 0.5, 0},  // max tokens inside the first block
		{randomTokens(rng, 55, 290), 30, -1, 0.1, 0}, // runs into the context limit
		{randomTokens(rng, 3, 290), 30, -1, 1, 0},    // useless drafts
		// Sampling: the walk draws one sample per visited node, in position
		// order, so with the same seed a spec run reproduces the
		// autoregressive run token for token.
		{randomTokens(rng, 4, 290), 40, -1, 0.2, 0.9},
	}
	for seed := uint64(1); seed <= 2; seed++ {
		for ji, j := range jobs {
			ar := newTestEngine(t, specTarget(seed), seed, Options{Context: ctxLen})
			req := Request{Prompt: j.prompt, MaxTokens: j.maxTokens, Sampling: SamplingParams{Temperature: j.temp, Seed: seed}}
			want, err := ar.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			var eos []int32
			if j.eosAt >= 0 && j.eosAt < len(want.Tokens) {
				eos = []int32{want.Tokens[j.eosAt]}
				ar.EOS = eos
				if want, err = ar.Generate(context.Background(), req); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range allSpecCases() {
				e := specEngine(t, seed, c, pathOracle(concat(j.prompt, want.Tokens)), j.noise, ctxLen)
				if eos != nil {
					e.EOS = eos
				}
				got, err := e.Generate(context.Background(), req)
				if err != nil {
					t.Fatalf("seed %d job %d %v: %v", seed, ji, c, err)
				}
				if !slices.Equal(got.Tokens, want.Tokens) || got.FinishReason != want.FinishReason {
					t.Fatalf("seed %d job %d %v: spec output differs from autoregressive\n got %v (%s)\nwant %v (%s)",
						seed, ji, c, got.Tokens, got.FinishReason, want.Tokens, want.FinishReason)
				}
			}
		}
	}
}

// TestDraftsEndAtMaxTokens: no draft reaches past the reply's last token.
// With a perfect drafter of 16-token blocks and replies shorter than a
// block, every accepted node is emitted: the statistics' accepted tokens
// plus the bonuses are exactly the reply's tokens after the first (without
// the cap, the last verify accepted nodes past max tokens and counted them).
func TestDraftsEndAtMaxTokens(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	prompt := randomTokens(rng, 9, 290)
	for _, maxTokens := range []int{2, 5, 12} {
		req := Request{Prompt: prompt, MaxTokens: maxTokens}
		want, err := newTestEngine(t, specTarget(1), 1, Options{Context: 64}).Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []specCase{{SpecLinear, 0, mamba.Replay}, {SpecTree, 8, mamba.Snapshot}} {
			e := specEngine(t, 1, c, pathOracle(concat(prompt, want.Tokens)), 0, 64)
			got, err := e.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Tokens, want.Tokens) {
				t.Fatalf("max tokens %d, %v: spec output differs from autoregressive", maxTokens, c)
			}
			st := got.Stats.SpecStats
			committed := 0
			for _, n := range st.AcceptanceLengths {
				committed += n
			}
			if committed != len(got.Tokens)-1 {
				t.Fatalf("max tokens %d, %v: verifies committed %d tokens (%v), the reply has %d after its first",
					maxTokens, c, committed, st.AcceptanceLengths, len(got.Tokens)-1)
			}
			if maxTokens > 2 && st.AcceptanceLength < 2 {
				t.Fatalf("max tokens %d, %v: τ %.2f, the perfect drafter's drafts were not accepted", maxTokens, c, st.AcceptanceLength)
			}
		}
	}
}

// TestChainTreeEqualsLinear: a tree whose budget fits the chain (with chain
// seeding) is the linear proposal, so output and statistics are identical.
func TestChainTreeEqualsLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	prompt := randomTokens(rng, 5, 290)
	req := Request{Prompt: prompt, MaxTokens: 50}
	ar, err := newTestEngine(t, specTarget(5), 5, Options{Context: 128}).Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	run := func(c specCase) *Result {
		res, err := specEngine(t, 5, c, pathOracle(concat(prompt, ar.Tokens)), 0.3, 128).Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	lin := run(specCase{SpecLinear, 0, mamba.Replay})
	for _, b := range []int{15, 12} {
		tree := run(specCase{SpecTree, b, mamba.Replay})
		if b == 15 && !slices.Equal(lin.Tokens, tree.Tokens) {
			t.Fatalf("b15 chain tree tokens differ from linear")
		}
		if b == 15 && (lin.Stats.AcceptanceLength != tree.Stats.AcceptanceLength ||
			lin.Stats.VerifySteps != tree.Stats.VerifySteps ||
			!slices.Equal(lin.Stats.PerPositionAcceptance, tree.Stats.PerPositionAcceptance)) {
			t.Fatalf("b15 chain tree stats differ from linear: %+v vs %+v", *tree.Stats.SpecStats, *lin.Stats.SpecStats)
		}
		if !slices.Equal(lin.Tokens, tree.Tokens) {
			t.Fatalf("b%d tree output differs from linear", b)
		}
	}
	if lin.Stats.AcceptanceLength <= 1.5 {
		t.Fatalf("oracle drafts at 30%% noise accepted only τ=%.2f: the test does not exercise acceptance", lin.Stats.AcceptanceLength)
	}
}

// shortBlockDrafter is an oracle that can also draft a shorter block.
type shortBlockDrafter struct {
	oracleDrafter
	blocks []int // of the shorter-block sessions started
}

func (d *shortBlockDrafter) NewBlockSession(prompt []int32, block int) (DraftSession, error) {
	d.blocks = append(d.blocks, block)
	return d.NewSession(prompt)
}

func TestDraftBlock(t *testing.T) {
	plain, short := &oracleDrafter{block: 16}, &shortBlockDrafter{oracleDrafter: oracleDrafter{block: 16}}
	// A choice between a DFlash-like drafter and a 4-row MTP-like chain
	// cuts the longer block only.
	choice := NewChoiceDrafter(&shortBlockDrafter{oracleDrafter: oracleDrafter{block: 16}}, &oracleDrafter{block: 4})
	for _, c := range []struct {
		d     Drafter
		depth int
		want  int
	}{
		{plain, 0, 16}, {plain, 4, 16}, // no shorter block to draft
		{short, 0, 16}, {short, 4, 5}, {short, 1, 2}, {short, 14, 15},
		{short, 15, 16}, {short, 40, 16}, // as deep as the block or deeper: the block
		{choice, 0, 16}, {choice, 4, 5}, {choice, 2, 3},
	} {
		if got := DraftBlock(c.d, c.depth); got != c.want {
			t.Errorf("DraftBlock(%T with block 16, depth %d) = %d, want %d", c.d, c.depth, got, c.want)
		}
	}
	// A choice session at block b gives the long drafter a b-row session
	// (b < 16) and the short one its own block. Sessions go round the
	// drafters before their speeds are measured: two at each block.
	dflashLike := choice.Drafters[0].(*shortBlockDrafter)
	for _, block := range []int{16, 5, 3} {
		for range choice.Drafters {
			if _, err := blockSession(choice, []int32{1}, block); err != nil {
				t.Fatal(err)
			}
		}
	}
	if want := []int{5, 3}; !slices.Equal(dflashLike.blocks, want) {
		t.Errorf("the choice's DFlash-like drafter started shorter blocks %v, want %v", dflashLike.blocks, want)
	}
}
