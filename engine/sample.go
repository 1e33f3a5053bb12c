package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// SamplingParams controls how a token is chosen from logits.
type SamplingParams struct {
	Temperature float64 // 0 means greedy
	TopK        int     // 0 means no limit
	TopP        float64 // 0 or 1 means no limit
	MinP        float64 // 0 means no limit: drop tokens below MinP × the top token's probability
	// Penalties over the request's output so far (presence and frequency as
	// in the OpenAI API, additive; repetition as in HF/vLLM, over prompt and
	// output, multiplicative; 0 or 1 means none).
	PresencePenalty   float64
	FrequencyPenalty  float64
	RepetitionPenalty float64
	LogitBias         map[int32]float32 // added to the raw logits
	Seed              uint64
	Logprobs          int // how many top alternatives to report per step (0: none)
}

// Validate reports parameters that cannot be honoured.
func (p SamplingParams) Validate() error {
	switch {
	case p.Temperature < 0 || math.IsNaN(p.Temperature) || math.IsInf(p.Temperature, 0):
		return fmt.Errorf("temperature %g: want a finite number >= 0", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("top_k %d: want >= 0", p.TopK)
	case p.TopP < 0 || p.TopP > 1 || math.IsNaN(p.TopP):
		return fmt.Errorf("top_p %g: want a number in [0, 1]", p.TopP)
	case p.Logprobs < 0 || p.Logprobs > 20:
		return fmt.Errorf("logprobs %d: want 0..20", p.Logprobs)
	}
	return nil
}

// Greedy reports whether tokens are chosen by argmax.
func (p SamplingParams) Greedy() bool { return p.Temperature == 0 }

// TokenLogprob is a token id with its log-probability under the model.
type TokenLogprob struct {
	ID      int32   `json:"id"`
	Logprob float64 `json:"logprob"`
}

// StepLogprobs is the chosen token's log-probability and the top alternatives.
type StepLogprobs struct {
	TokenLogprob
	Top []TokenLogprob `json:"top"`
}

// Sampler chooses tokens from logit rows. The same seed and the same logits
// give the same tokens.
type Sampler struct {
	params SamplingParams
	valid  int // logits at or beyond this id are padding rows and never chosen
	rng    *rand.Rand
}

// NewSampler makes a sampler for a vocabulary whose first valid ids are real tokens.
func NewSampler(p SamplingParams, valid int) *Sampler {
	return &Sampler{params: p, valid: valid, rng: rand.New(rand.NewPCG(p.Seed, 0x9e3779b97f4a7c15))}
}

// Distribution returns the probabilities the sampler draws from (after
// temperature, top-k and top-p), as a sparse list sorted by descending
// probability. Greedy sampling is the point mass on the argmax.
func (s *Sampler) Distribution(logits []float32) []TokenLogprob {
	row := logits[:s.valid]
	if s.params.Greedy() {
		return []TokenLogprob{{ID: int32(Argmax(row)), Logprob: 0}}
	}
	cand := make([]TokenLogprob, len(row))
	for i, v := range row {
		cand[i] = TokenLogprob{ID: int32(i), Logprob: float64(v) / s.params.Temperature}
	}
	sort.SliceStable(cand, func(a, b int) bool { return cand[a].Logprob > cand[b].Logprob })
	if k := s.params.TopK; k > 0 && k < len(cand) {
		cand = cand[:k]
	}
	normalize(cand)
	if p := s.params.TopP; p > 0 && p < 1 {
		cum := 0.0
		for i, c := range cand {
			cum += math.Exp(c.Logprob)
			if cum >= p {
				cand = cand[:i+1]
				break
			}
		}
		normalize(cand)
	}
	return cand
}

// Sample draws one token from the logits.
func (s *Sampler) Sample(logits []float32) int32 {
	dist := s.Distribution(logits)
	return s.Draw(dist)
}

// Draw picks a token from a distribution made by Distribution.
func (s *Sampler) Draw(dist []TokenLogprob) int32 {
	if len(dist) == 1 {
		return dist[0].ID
	}
	u := s.rng.Float64()
	for _, c := range dist {
		u -= math.Exp(c.Logprob)
		if u < 0 {
			return c.ID
		}
	}
	return dist[len(dist)-1].ID // rounding left a sliver: the least likely kept token
}

// Logprobs reports the chosen token's log-probability under the model's own
// distribution (raw logits, padding masked) and the top n alternatives.
func (s *Sampler) Logprobs(logits []float32, chosen int32, n int) StepLogprobs {
	row := logits[:s.valid]
	lse := logSumExp(row)
	out := StepLogprobs{TokenLogprob: TokenLogprob{ID: chosen, Logprob: float64(row[chosen]) - lse}}
	for _, id := range topIndices(row, n) {
		out.Top = append(out.Top, TokenLogprob{ID: int32(id), Logprob: float64(row[id]) - lse})
	}
	return out
}

// Argmax returns the index of the largest value, the lowest index on ties.
func Argmax(row []float32) int {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return best
}

// normalize turns log-weights into log-probabilities.
func normalize(c []TokenLogprob) {
	m := c[0].Logprob
	sum := 0.0
	for _, x := range c {
		sum += math.Exp(x.Logprob - m)
	}
	lse := m + math.Log(sum)
	for i := range c {
		c[i].Logprob -= lse
	}
}

func logSumExp(row []float32) float64 {
	m := float64(row[Argmax(row)])
	sum := 0.0
	for _, v := range row {
		sum += math.Exp(float64(v) - m)
	}
	return m + math.Log(sum)
}

// topIndices returns the indices of the n largest values, descending, ties by lower index.
func topIndices(row []float32, n int) []int {
	idx := make([]int, len(row))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return row[idx[a]] > row[idx[b]] })
	return idx[:min(n, len(idx))]
}
