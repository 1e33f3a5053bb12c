package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
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

// Validate reports parameters that cannot be honoured. Token ids (logit
// bias) are checked against the vocabulary by Engine.CheckRequest.
func (p SamplingParams) Validate() error {
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	switch {
	case p.Temperature < 0 || !finite(p.Temperature):
		return fmt.Errorf("temperature %g: want a finite number >= 0", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("top_k %d: want >= 0", p.TopK)
	case !(p.TopP >= 0 && p.TopP <= 1):
		return fmt.Errorf("top_p %g: want a number in [0, 1]", p.TopP)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return fmt.Errorf("min_p %g: want a number in [0, 1]", p.MinP)
	case !(p.PresencePenalty >= -2 && p.PresencePenalty <= 2):
		return fmt.Errorf("presence_penalty %g: want a number in [-2, 2]", p.PresencePenalty)
	case !(p.FrequencyPenalty >= -2 && p.FrequencyPenalty <= 2):
		return fmt.Errorf("frequency_penalty %g: want a number in [-2, 2]", p.FrequencyPenalty)
	case p.RepetitionPenalty < 0 || !finite(p.RepetitionPenalty):
		return fmt.Errorf("repetition_penalty %g: want a finite number > 0 (0 or 1: none)", p.RepetitionPenalty)
	case p.Logprobs < 0 || p.Logprobs > 20:
		return fmt.Errorf("logprobs %d: want 0..20", p.Logprobs)
	}
	for id, b := range p.LogitBias {
		if !(b >= -100 && b <= 100) {
			return fmt.Errorf("logit_bias[%d] = %g: want a number in [-100, 100]", id, b)
		}
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

// ErrNoToken is returned when every logit of a row is -Inf (or NaN): a
// constraint or the processors left no token to choose.
var ErrNoToken = errors.New("no token can be chosen: every logit is -Inf or NaN")

// Sampler chooses tokens from logit rows. The same seed and the same logits
// give the same tokens.
//
// Cost per row of V logits: one pass for the maximum, one for the kept
// candidates and their weights, and top-k by a k-heap, top-p by quickselect
// on the weights: O(V) plus O(k log k), never a sort of the vocabulary.
type Sampler struct {
	params SamplingParams
	valid  int // logits at or beyond this id are padding rows and never chosen
	rng    *rand.Rand
	kept   []candidate // scratch reused by every call
}

// NewSampler makes a sampler for a vocabulary whose first valid ids are real tokens.
func NewSampler(p SamplingParams, valid int) *Sampler {
	return &Sampler{params: p, valid: valid, rng: rand.New(rand.NewPCG(p.Seed, 0x9e3779b97f4a7c15))}
}

// candidate is a token the sampler may draw.
type candidate struct {
	weight float64 // exp((logit − max logit) / T): its unnormalised probability
	logit  float32
	id     int32
}

// beats orders candidates by logit, then by lower id (the TopK kernels' order).
func (c candidate) beats(o candidate) bool {
	return c.logit > o.logit || (c.logit == o.logit && c.id < o.id)
}

func byRank(a, b candidate) int {
	if a.beats(b) {
		return -1
	}
	return 1
}

// noFloor admits every finite logit (and excludes -Inf).
const noFloor = -math.MaxFloat64

// distribution returns the candidates the sampler draws from, after
// temperature, min-p, top-k and top-p (as vLLM applies them), in no
// particular order, with their total weight. It is empty when every logit is
// -Inf or NaN. Greedy sampling is the point mass on the argmax. The slice is
// the sampler's scratch, valid until the next call.
func (s *Sampler) distribution(logits []float32) ([]candidate, float64) {
	row, p := logits[:s.valid], s.params
	best := Argmax(row)
	top := row[best]
	if !(top > float32(math.Inf(-1))) {
		return nil, 0
	}
	if p.Greedy() {
		s.kept = append(s.kept[:0], candidate{weight: 1, logit: top, id: int32(best)})
		return s.kept, 1
	}
	// min-p keeps p_i ≥ MinP·p_max, that is logit_i ≥ max + T·ln(MinP): a
	// threshold on the logits, so it needs no exponentials.
	floor := noFloor
	if p.MinP > 0 {
		floor = float64(top) + p.Temperature*math.Log(p.MinP)
	}
	if p.TopK > 0 && p.TopK < len(row) {
		s.kept = selectTopK(s.kept[:0], row, p.TopK, floor)
	} else {
		s.kept = s.kept[:0]
		for i, v := range row {
			if float64(v) >= floor {
				s.kept = append(s.kept, candidate{logit: v, id: int32(i)})
			}
		}
	}
	// exp(x) as exp2(x·log2 e): Go's Exp2 is several times faster than Exp
	// on amd64, and the extra rounding (|x|·2⁻⁵³ relative) is far below what
	// sampling can resolve.
	scale, total := math.Log2E/p.Temperature, 0.0
	for i := range s.kept {
		w := math.Exp2((float64(s.kept[i].logit) - float64(top)) * scale)
		s.kept[i].weight = w
		total += w
	}
	if p.TopP > 0 && p.TopP < 1 {
		s.kept = s.kept[:cutTopP(s.kept, p.TopP*total)]
		total = 0
		for _, c := range s.kept {
			total += c.weight
		}
	}
	return s.kept, total
}

// Distribution returns the probabilities the sampler draws from (after
// temperature, min-p, top-k and top-p), most likely first. It is empty when
// no token can be chosen. Greedy sampling is the point mass on the argmax.
func (s *Sampler) Distribution(logits []float32) []TokenLogprob {
	kept, total := s.distribution(logits)
	kept = slices.Clone(kept)
	slices.SortFunc(kept, byRank)
	out := make([]TokenLogprob, len(kept))
	for i, c := range kept {
		out[i] = TokenLogprob{ID: c.id, Logprob: math.Log(c.weight / total)}
	}
	return out
}

// Sample draws one token from the logits. It uses one random number when
// more than one token can be drawn, none otherwise.
func (s *Sampler) Sample(logits []float32) (int32, error) {
	kept, total := s.distribution(logits)
	switch len(kept) {
	case 0:
		return 0, ErrNoToken
	case 1:
		return kept[0].id, nil
	}
	u := s.rng.Float64() * total
	for _, c := range kept {
		u -= c.weight
		if u < 0 {
			return c.id, nil
		}
	}
	return kept[len(kept)-1].id, nil // rounding left a sliver: the last kept token
}

// Logprobs reports the chosen token's log-probability under the model's own
// distribution (raw logits, padding masked) and the top n alternatives.
func (s *Sampler) Logprobs(logits []float32, chosen int32, n int) StepLogprobs {
	row := logits[:s.valid]
	lse := logSumExp(row)
	out := StepLogprobs{TokenLogprob: TokenLogprob{ID: chosen, Logprob: float64(row[chosen]) - lse}}
	top := selectTopK(nil, row, n, noFloor)
	slices.SortFunc(top, byRank)
	for _, c := range top {
		out.Top = append(out.Top, TokenLogprob{ID: c.id, Logprob: float64(c.logit) - lse})
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

func logSumExp(row []float32) float64 {
	m := float64(row[Argmax(row)])
	if math.IsInf(m, -1) {
		return m
	}
	sum := 0.0
	for _, v := range row {
		sum += math.Exp2((float64(v) - m) * math.Log2E)
	}
	return m + math.Log(sum)
}

// selectTopK appends to dst the k best entries of row (by value, then lower
// index) whose value is at least floor, in heap order: a k-heap whose root
// is the weakest kept entry, so most entries cost one comparison.
func selectTopK(dst []candidate, row []float32, k int, floor float64) []candidate {
	h := dst[:0]
	for i, v := range row {
		if !(float64(v) >= floor) {
			continue
		}
		c := candidate{logit: v, id: int32(i)}
		if len(h) < k {
			h = append(h, c)
			for j := len(h) - 1; j > 0; { // sift up
				parent := (j - 1) / 2
				if !h[parent].beats(h[j]) {
					break
				}
				h[parent], h[j] = h[j], h[parent]
				j = parent
			}
			continue
		}
		if !c.beats(h[0]) {
			continue
		}
		h[0] = c
		for j := 0; ; { // sift down
			weakest, l, r := j, 2*j+1, 2*j+2
			if l < len(h) && h[weakest].beats(h[l]) {
				weakest = l
			}
			if r < len(h) && h[weakest].beats(h[r]) {
				weakest = r
			}
			if weakest == j {
				break
			}
			h[j], h[weakest] = h[weakest], h[j]
			j = weakest
		}
	}
	return h
}

// cutTopP reorders c so that its best candidates come first and returns how
// many of them form the smallest set whose weight reaches target (ranked by
// logit, then lower id: the prefix a sort would keep). Quickselect on the
// rank with running weight sums: O(len(c)) expected, and only the last few
// candidates around the cut are sorted.
func cutTopP(c []candidate, target float64) int {
	lo, hi, mass := 0, len(c), 0.0 // c[:lo] is kept with weight mass < target; the cut is in (lo, hi]
	for hi-lo > 32 {
		mid := lo + partition(c[lo:hi])
		better := 0.0
		for _, x := range c[lo:mid] {
			better += x.weight
		}
		switch {
		case mass+better >= target:
			hi = mid
		case mass+better+c[mid].weight >= target:
			return mid + 1
		default:
			mass += better + c[mid].weight
			lo = mid + 1
		}
	}
	slices.SortFunc(c[lo:hi], byRank)
	for i := lo; i < hi; i++ {
		if mass += c[i].weight; mass >= target {
			return i + 1
		}
	}
	return hi
}

// partition moves the candidates that beat a median-of-three pivot before
// it and the rest after it, and returns the pivot's index.
func partition(c []candidate) int {
	last, mid := len(c)-1, len(c)/2
	if c[mid].beats(c[0]) {
		c[0], c[mid] = c[mid], c[0]
	}
	if c[last].beats(c[0]) {
		c[0], c[last] = c[last], c[0]
	}
	if c[last].beats(c[mid]) {
		c[mid], c[last] = c[last], c[mid]
	}
	// c[0] ≥ c[mid] ≥ c[last]: the median goes last as the pivot.
	c[mid], c[last] = c[last], c[mid]
	pivot, i := c[last], 0
	for j := range last {
		if c[j].beats(pivot) {
			c[i], c[j] = c[j], c[i]
			i++
		}
	}
	c[i], c[last] = c[last], c[i]
	return i
}
