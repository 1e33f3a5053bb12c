package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"ddflash/kernels/cpu"
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
// Cost per row of V logits, never a sort of the vocabulary: one pass for the
// maximum; then top-k by a k-heap (one comparison for most entries), or
// min-p by a threshold on the logits, and float64 weights for the tokens
// kept; or else the weights of the whole row in one vectorised pass
// (cpu.ExpWeights: float32 exponentials summed in float64). Top-p is cut
// by quickselect among the tokens kept, or, over the whole row, among the
// few that a histogram of the weights cannot rule out.
type Sampler struct {
	params SamplingParams
	valid  int // logits at or beyond this id are padding rows and never chosen
	rng    *rand.Rand
	// scratch reused by every call
	kept    []candidate
	weights []float32
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
const noFloor = -math.MaxFloat32

// weighted is the distribution a token is drawn from: either the kept
// candidates, or (dense, when kept is nil) a weight for every id.
type weighted struct {
	kept  []candidate
	dense []float32
	total float64
}

// distribution returns what the sampler draws from, after temperature,
// min-p, top-k and top-p (as vLLM applies them); total is 0 when every
// logit is -Inf or NaN. Greedy sampling is the point mass on the argmax.
// The result lives in the sampler's scratch until the next call.
func (s *Sampler) distribution(logits []float32) weighted {
	row, p := logits[:s.valid], s.params
	best := Argmax(row)
	top := row[best]
	if !(top > float32(math.Inf(-1))) {
		return weighted{}
	}
	if p.Greedy() {
		s.kept = append(s.kept[:0], candidate{weight: 1, logit: top, id: int32(best)})
		return weighted{kept: s.kept, total: 1}
	}
	// min-p keeps p_i ≥ MinP·p_max, that is logit_i ≥ max + T·ln(MinP): a
	// threshold on the logits (noFloor drops only -Inf).
	floor := float32(noFloor)
	if p.MinP > 0 {
		floor = float32(float64(top) + p.Temperature*math.Log(p.MinP))
	}
	switch {
	case p.TopK > 0 && p.TopK < len(row):
		s.kept = selectTopK(s.kept[:0], row, p.TopK, floor)
		return s.weigh(top)
	case p.MinP > 0:
		s.kept = s.kept[:0]
		for i, v := range row {
			if v >= floor {
				s.kept = append(s.kept, candidate{logit: v, id: int32(i)})
			}
		}
		return s.weigh(top)
	}
	w := s.scratchWeights(len(row))
	total := cpu.ExpWeights(w, row, top, float32(1/p.Temperature))
	if p.TopP > 0 && p.TopP < 1 {
		s.kept = topPCandidates(s.kept[:0], row, w, (1-p.TopP)*total)
		return s.cut(p.TopP * total)
	}
	return weighted{dense: w, total: total}
}

// weigh gives the kept candidates (top-k or min-p survivors) float64
// weights and applies top-p to them.
func (s *Sampler) weigh(top float32) weighted {
	p := s.params
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
		return s.cut(p.TopP * total)
	}
	return weighted{kept: s.kept, total: total}
}

// cut keeps the smallest best-first prefix of s.kept whose weight reaches target.
func (s *Sampler) cut(target float64) weighted {
	s.kept = s.kept[:cutTopP(s.kept, target)]
	total := 0.0
	for _, c := range s.kept {
		total += c.weight
	}
	return weighted{kept: s.kept, total: total}
}

// topPCandidates appends to dst the tokens top-p may keep: all but the
// least likely ones whose combined weight is certainly under excluded
// ((1 − p) of the total), which no top-p prefix can reach. A histogram of
// the weights' binary exponents (weights in bucket e are below 2^(e−126))
// bounds that tail without a sort.
func topPCandidates(dst []candidate, row, w []float32, excluded float64) []candidate {
	var count [256]int
	for _, x := range w {
		count[math.Float32bits(x)>>23]++
	}
	lowest, tail := 0, 0.0 // buckets below lowest are ruled out; tail bounds their weight
	for e, n := range count {
		bound := tail + float64(n)*math.Ldexp(1, e-126)
		if bound >= excluded {
			break
		}
		lowest, tail = e+1, bound
	}
	for i, x := range w {
		if x > 0 && int(math.Float32bits(x)>>23) >= lowest {
			dst = append(dst, candidate{weight: float64(x), logit: row[i], id: int32(i)})
		}
	}
	return dst
}

// Distribution returns the probabilities the sampler draws from (after
// temperature, min-p, top-k and top-p), most likely first. It is empty when
// no token can be chosen. Greedy sampling is the point mass on the argmax.
func (s *Sampler) Distribution(logits []float32) []TokenLogprob {
	d := s.distribution(logits)
	kept := slices.Clone(d.kept)
	for id, w := range d.dense {
		if w > 0 {
			kept = append(kept, candidate{weight: float64(w), logit: logits[id], id: int32(id)})
		}
	}
	slices.SortFunc(kept, byRank)
	out := make([]TokenLogprob, len(kept))
	for i, c := range kept {
		out[i] = TokenLogprob{ID: c.id, Logprob: math.Log(c.weight / d.total)}
	}
	return out
}

// Sample draws one token from the logits. It uses one random number when
// more than one token can be drawn, none otherwise.
func (s *Sampler) Sample(logits []float32) (int32, error) {
	d := s.distribution(logits)
	switch {
	case d.total == 0:
		return 0, ErrNoToken
	case len(d.kept) == 1:
		return d.kept[0].id, nil
	}
	u := s.rng.Float64() * d.total
	if d.dense != nil {
		return drawDense(d.dense, u), nil
	}
	for _, c := range d.kept {
		u -= c.weight
		if u < 0 {
			return c.id, nil
		}
	}
	return d.kept[len(d.kept)-1].id, nil // rounding left a sliver: the last kept token
}

// drawDense returns the first id whose cumulative weight passes u, skipping
// whole blocks by their sums (independent adds, not one long chain).
func drawDense(w []float32, u float64) int32 {
	const block = 64
	last := int32(-1)
	for lo := 0; lo < len(w); lo += block {
		b := w[lo:min(lo+block, len(w))]
		var s0, s1, s2, s3 float64
		i := 0
		for ; i+4 <= len(b); i += 4 {
			s0 += float64(b[i])
			s1 += float64(b[i+1])
			s2 += float64(b[i+2])
			s3 += float64(b[i+3])
		}
		for ; i < len(b); i++ {
			s0 += float64(b[i])
		}
		if sum := s0 + s1 + s2 + s3; u >= sum {
			u -= sum
			if sum > 0 {
				last = int32(lo + len(b) - 1)
			}
			continue
		}
		for i, x := range b {
			if u -= float64(x); u < 0 {
				return int32(lo + i)
			}
		}
	}
	for last > 0 && w[last] == 0 { // rounding left a sliver: the last token with weight
		last--
	}
	return last
}

// Logprobs reports the chosen token's log-probability under the model's own
// distribution (raw logits, padding masked) and the top n alternatives.
func (s *Sampler) Logprobs(logits []float32, chosen int32, n int) StepLogprobs {
	row := logits[:s.valid]
	lse := s.logSumExp(row)
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

// logSumExp is log Σ exp(row), for log-probabilities: the weights in one
// vectorised pass into scratch.
func (s *Sampler) logSumExp(row []float32) float64 {
	m := row[Argmax(row)]
	if math.IsInf(float64(m), -1) {
		return float64(m)
	}
	return float64(m) + math.Log(cpu.ExpWeights(s.scratchWeights(len(row)), row, m, 1))
}

// scratchWeights is the sampler's weight scratch, n long.
func (s *Sampler) scratchWeights(n int) []float32 {
	if cap(s.weights) < n {
		s.weights = make([]float32, n)
	}
	return s.weights[:n]
}

// selectTopK appends to dst the k best entries of row (by value, then lower
// index) whose value is at least floor, in heap order: a k-heap whose root
// is the weakest kept entry, so most entries cost one comparison.
func selectTopK(dst []candidate, row []float32, k int, floor float32) []candidate {
	h := dst[:0]
	for i, v := range row {
		if !(v >= floor) {
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
