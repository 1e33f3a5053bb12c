package engine

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/mamba"
)

// referenceProcess applies a request's logit processors to a raw row in
// float64, written from their definitions (vLLM's order): constraint,
// logit bias, min_tokens, repetition (prompt and output), frequency and
// presence (output).
func referenceProcess(raw []float32, valid int, r Request, eos []int32, output []int32) []float64 {
	row := make([]float64, valid)
	for i := range row {
		row[i] = float64(raw[i])
	}
	if r.Constraint != nil {
		mask := make([]float32, valid)
		r.Constraint.Mask(output, mask)
		for i, m := range mask {
			if math.IsInf(float64(m), -1) {
				row[i] = math.Inf(-1)
			}
		}
	}
	for id, b := range r.Sampling.LogitBias {
		row[id] += float64(b)
	}
	if len(output) < r.MinTokens {
		stops := slices.Clone(r.StopTokenIDs)
		if !r.IgnoreEOS {
			stops = append(stops, eos...)
		}
		for _, id := range stops {
			row[id] = math.Inf(-1)
		}
	}
	if rp := r.Sampling.RepetitionPenalty; rp != 0 {
		seen := map[int32]bool{}
		for _, t := range append(slices.Clone(r.Prompt), output...) {
			if seen[t] {
				continue
			}
			seen[t] = true
			if row[t] > 0 {
				row[t] /= rp
			} else {
				row[t] *= rp
			}
		}
	}
	counts := map[int32]int{}
	for _, t := range output {
		counts[t]++
	}
	for id, n := range counts {
		row[id] -= r.Sampling.FrequencyPenalty*float64(n) + r.Sampling.PresencePenalty
	}
	return row
}

// modConstraint allows the tokens t with (t + key) % mod == 0, where key
// depends on the prefix (its length and last token): a few allowed tokens
// per position, different after every prefix.
type modConstraint struct{ mod int }

func (c modConstraint) key(output []int32) int {
	k := 3 * len(output)
	if len(output) > 0 {
		k += int(output[len(output)-1])
	}
	return k
}

func (c modConstraint) Mask(output []int32, row []float32) {
	k := c.key(output)
	for i := range row {
		if (i+k)%c.mod != 0 {
			row[i] = float32(math.Inf(-1))
		}
	}
}

func (c modConstraint) allows(output []int32, tok int32) bool {
	return (int(tok)+c.key(output))%c.mod == 0
}

// TestProcessorsMatchReference compares the processed rows with the float64
// reference, for random requests, outputs and speculative paths (the
// processors see output followed by path).
func TestProcessorsMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	const valid = 300
	eos := []int32{7, 11}
	for trial := range 200 {
		r := Request{
			Prompt:       randomTokens(rng, 1+rng.IntN(20), 40),
			MinTokens:    rng.IntN(6),
			IgnoreEOS:    trial%3 == 0,
			StopTokenIDs: randomTokens(rng, rng.IntN(3), valid),
		}
		s := &r.Sampling
		switch trial % 4 {
		case 0:
			s.PresencePenalty, s.FrequencyPenalty = 1.5*rng.Float64()-0.5, 1.5*rng.Float64()-0.5
		case 1:
			s.RepetitionPenalty = 0.5 + 1.5*rng.Float64()
		case 2:
			s.LogitBias = map[int32]float32{int32(rng.IntN(valid)): 5, int32(rng.IntN(valid)): -100}
			r.Constraint = modConstraint{mod: 7}
		default:
			s.PresencePenalty, s.FrequencyPenalty, s.RepetitionPenalty = 0.4, -0.3, 1.2
			s.LogitBias = map[int32]float32{int32(rng.IntN(valid)): 1.5}
		}
		raw := make([]float32, valid+5) // padding beyond valid
		for i := range raw {
			raw[i] = float32(rng.NormFloat64() * 3)
		}
		output := randomTokens(rng, rng.IntN(8), 40)
		path := randomTokens(rng, rng.IntN(4), 40)
		p := newProcessors(&r, eos, valid)
		for _, tok := range output {
			p.emitted(tok)
		}
		got := p.apply(raw, output, path)
		want := referenceProcess(raw, valid, r, eos, concat(output, path))
		if len(got) < valid {
			t.Fatalf("trial %d: %d logits, want at least %d", trial, len(got), valid)
		}
		for i, w := range want {
			if g := float64(got[i]); !processedClose(g, w) {
				t.Fatalf("trial %d (%+v, output %v, path %v): logit %d = %g, want %g", trial, r.Sampling, output, path, i, g, w)
			}
		}
		// The path's tokens counted for that position only: the next
		// position after the output alone sees the output alone.
		alone := p.apply(raw, output, nil)
		for i, w := range referenceProcess(raw, valid, r, eos, output) {
			if g := float64(alone[i]); !processedClose(g, w) {
				t.Fatalf("trial %d: after a path, logit %d = %g, want %g", trial, i, g, w)
			}
		}
	}
}

// processedClose compares a float32 processed logit with the float64
// reference: both -Inf, or within 1e-5 relative (float32 rounding of the
// penalties); NaN never compares close.
func processedClose(got, want float64) bool {
	return (math.IsInf(want, -1) && math.IsInf(got, -1)) || math.Abs(got-want) <= 1e-5*(1+math.Abs(want))
}

// TestSpecWithProcessorsIsLossless: with penalties, logit bias, min_tokens,
// stop ids and a constraint, every spec mode produces the autoregressive
// output token for token, greedy and seeded sampling alike (each tree node
// is processed along its own path).
func TestSpecWithProcessorsIsLossless(t *testing.T) {
	const ctxLen, seed = 64, 3
	rng := rand.New(rand.NewPCG(31, 32))
	penalties := SamplingParams{PresencePenalty: 0.8, FrequencyPenalty: 0.6, RepetitionPenalty: 1.4,
		LogitBias: map[int32]float32{5: 0.7, 17: 0.5, 200: -3}}
	sampled := penalties
	sampled.Temperature, sampled.TopP, sampled.MinP, sampled.Seed = 0.9, 0.95, 0.02, 4
	constraint := modConstraint{mod: 9}
	prompt := randomTokens(rng, 6, 290)
	plain, err := newTestEngine(t, "tiny", seed, Options{Context: ctxLen}).Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 30})
	if err != nil {
		t.Fatal(err)
	}
	requests := map[string]Request{
		"penalties":          {Prompt: prompt, MaxTokens: 30, Sampling: penalties},
		"penalties-sampled":  {Prompt: prompt, MaxTokens: 30, Sampling: sampled},
		"constraint":         {Prompt: prompt, MaxTokens: 30, Constraint: constraint},
		"constraint-sampled": {Prompt: prompt, MaxTokens: 30, Constraint: constraint, Sampling: sampled},
		// The plain output's third token stops it, but not before 6 tokens.
		"min-tokens-stop": {Prompt: prompt, MaxTokens: 30, StopTokenIDs: []int32{plain.Tokens[2]}, MinTokens: 6},
	}
	cases := []specCase{{SpecLinear, 0, mamba.Replay}, {SpecLinear, 0, mamba.Snapshot}, {SpecTree, 4, mamba.Replay}, {SpecTree, 16, mamba.Snapshot}}
	for name, req := range requests {
		want, err := newTestEngine(t, "tiny", seed, Options{Context: ctxLen}).Generate(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		switch name {
		case "penalties":
			if slices.Equal(want.Tokens, plain.Tokens) {
				t.Fatalf("penalties did not change the greedy output %v: the test does not exercise them", want.Tokens)
			}
		case "constraint", "constraint-sampled":
			for i, tok := range want.Tokens {
				if !constraint.allows(want.Tokens[:i], tok) {
					t.Fatalf("%s: token %d (%d) is not allowed after %v", name, i, tok, want.Tokens[:i])
				}
			}
		case "min-tokens-stop":
			stop := req.StopTokenIDs[0]
			if i := slices.Index(want.Tokens, stop); i >= 0 && i < req.MinTokens {
				t.Fatalf("stop token %d at %d, before min tokens %d: %v", stop, i, req.MinTokens, want.Tokens)
			}
			if i := slices.Index(want.Tokens, stop); i >= 0 && (i != len(want.Tokens)-1 || want.FinishReason != FinishStop) {
				t.Fatalf("the stop token %d did not end the output %v (%s)", stop, want.Tokens, want.FinishReason)
			}
		}
		for _, c := range cases {
			e := specEngine(t, seed, c, pathOracle(concat(prompt, want.Tokens)), 0.25, ctxLen)
			got, err := e.Generate(context.Background(), req)
			if err != nil {
				t.Fatalf("%s %v: %v", name, c, err)
			}
			if !slices.Equal(got.Tokens, want.Tokens) || got.FinishReason != want.FinishReason {
				t.Fatalf("%s %v: spec output differs from autoregressive\n got %v (%s)\nwant %v (%s)",
					name, c, got.Tokens, got.FinishReason, want.Tokens, want.FinishReason)
			}
			if got.Stats.AcceptanceLength <= 1.2 {
				t.Errorf("%s %v: τ %.2f: the drafts were hardly ever accepted", name, c, got.Stats.AcceptanceLength)
			}
		}
	}
}

// TestConstraintAllowingNothingFails: a row with no allowed token fails the
// request with an error instead of choosing a forbidden token.
func TestConstraintAllowingNothingFails(t *testing.T) {
	e := newTestEngine(t, "tiny", 1, Options{Context: 32})
	_, err := e.Generate(context.Background(), Request{Prompt: []int32{1, 2}, MaxTokens: 4, Constraint: denyAll{}})
	if err == nil {
		t.Fatal("a constraint allowing no token generated output")
	}
}

type denyAll struct{}

func (denyAll) Mask(_ []int32, row []float32) {
	for i := range row {
		row[i] = float32(math.Inf(-1))
	}
}
