package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"ddflash/kernels/rowmath"
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
// Cost per row of V logits, never a sort of the vocabulary; the passes over
// the whole row are the vectorised row kernels of kernels/rowmath. One pass for
// the maximum; then top-k by a k-heap fed only the entries that beat its
// weakest (rowmath.NextAtLeast skips the rest 16 at a time), or min-p by a
// threshold on the logits, and weights for the tokens kept; or else the
// weights of the whole row in one pass (rowmath.ExpWeights: float32
// exponentials summed in float64). Top-p is cut by quickselect among the
// tokens kept, or, over the whole row, among the few between two logit
// bounds that a histogram of the weights places around the cut (see topP).
//
// NaN logits count as -Inf (never chosen). A +Inf logit is a certainty:
// the first one is chosen, as greedy sampling would.
type Sampler struct {
	params SamplingParams
	valid  int // logits at or beyond this id are padding rows and never chosen
	rng    *rand.Rand
	// scratch reused by every call
	kept      []candidate
	ids       []int32
	weights   []float32          // the whole row's weights, or the kept tokens' logits then weights
	histogram *rowmath.Histogram // top-p's over the whole row, made on its first use
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

// weighted is the distribution a token is drawn from: a weight for every
// id (dense, summing to denseTotal; nil when there is none), then the kept
// candidates; total is the sum of both.
type weighted struct {
	dense      []float32
	denseTotal float64
	kept       []candidate
	total      float64
}

// distribution returns what the sampler draws from, after temperature,
// min-p, top-k and top-p (as vLLM applies them); total is 0 when every
// logit is -Inf or NaN. Greedy sampling is the point mass on the argmax.
// The result lives in the sampler's scratch until the next call.
func (s *Sampler) distribution(logits []float32) weighted {
	row, p := logits[:s.valid], s.params
	best := rowmath.MaxIndex(row)
	if best < 0 || math.IsInf(float64(row[best]), -1) {
		return weighted{}
	}
	top := row[best]
	if s.certain(top) {
		return s.pointMass(top, int32(best))
	}
	floor := s.floor(top)
	switch {
	case p.TopK > 0 && p.TopK < len(row):
		s.kept = selectTopK(s.kept[:0], row, p.TopK, floor)
		slices.SortFunc(s.kept, byRank) // the device's order (see SampleTop)
		return s.weigh(top)
	case p.MinP > 0:
		s.kept = s.appendBetween(s.kept[:0], row, floor, float32(math.Inf(1)))
		return s.weigh(top)
	}
	w := s.scratchWeights(len(row))
	scale := float32(1 / p.Temperature)
	total := rowmath.ExpWeights(w, row, top, scale)
	if p.TopP > 0 && p.TopP < 1 {
		return s.topP(row, w, top, scale, total, p.TopP*total)
	}
	return weighted{dense: w, denseTotal: total, total: total}
}

// certain reports whether the top logit is drawn for sure: greedy
// sampling, a +Inf logit, or a temperature whose inverse overflows float32
// (greedy sampling's limit).
func (s *Sampler) certain(top float32) bool {
	return s.params.Greedy() || math.IsInf(float64(top), 1) || math.IsInf(float64(float32(1/s.params.Temperature)), 1)
}

func (s *Sampler) pointMass(top float32, id int32) weighted {
	s.kept = append(s.kept[:0], candidate{weight: 1, logit: top, id: id})
	return weighted{kept: s.kept, total: 1}
}

// floor is the lowest logit min-p keeps: p_i ≥ MinP·p_max, that is
// logit_i ≥ max + T·ln(MinP) (without min-p, noFloor drops only -Inf).
func (s *Sampler) floor(top float32) float32 {
	if p := s.params; p.MinP > 0 {
		return float32(float64(top) + p.Temperature*math.Log(p.MinP))
	}
	return noFloor
}

// topDistribution is distribution for a top-k sampler given the row's k
// best logits and their ids, best first, ties by lower id (the backends'
// TopK): the same candidates in the same order, so the same draws.
func (s *Sampler) topDistribution(logits []float32, ids []int32) weighted {
	best := rowmath.MaxIndex(logits)
	if best < 0 || math.IsInf(float64(logits[best]), -1) {
		return weighted{}
	}
	top := logits[best]
	if s.certain(top) {
		return s.pointMass(top, ids[best])
	}
	floor := s.floor(top)
	s.kept = s.kept[:0]
	for i, v := range logits {
		if v >= floor {
			s.kept = append(s.kept, candidate{logit: v, id: ids[i]})
		}
	}
	return s.weigh(top)
}

// appendBetween appends to dst the entries of row in [lo, hi).
func (s *Sampler) appendBetween(dst []candidate, row []float32, lo, hi float32) []candidate {
	s.ids = rowmath.AppendBetween(s.ids[:0], row, lo, hi)
	for _, id := range s.ids {
		dst = append(dst, candidate{logit: row[id], id: id})
	}
	return dst
}

// weigh gives the kept candidates (top-k or min-p survivors) their
// weights, by the same kernel as a whole row's, and applies top-p to them.
func (s *Sampler) weigh(top float32) weighted {
	p, n := s.params, len(s.kept)
	scratch := s.scratchWeights(2 * n)
	logits, w := scratch[:n], scratch[n:]
	for i, c := range s.kept {
		logits[i] = c.logit
	}
	total := rowmath.ExpWeights(w, logits, top, float32(1/p.Temperature))
	for i := range s.kept {
		s.kept[i].weight = float64(w[i])
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

// topPBoundary is the most tokens top-p quickselects among, and the
// largest nucleus drawn from the kept list alone.
const topPBoundary = 4096

// topP keeps the best-first prefix of the whole row whose weight w first
// reaches target (p of the total; w are ExpWeights(w, row, top, scale),
// summing to total). rowmath.FindNucleus brackets the cut between two
// logits with a histogram of the weights over the logits (one pass over
// the row for a language model's logits, a few for any row); quickselect
// then cuts among the tokens between. A nucleus of at most topPBoundary
// tokens is drawn from the kept list alone; in a larger one the tokens
// above the bracket, however many, stay in w (the others' weights are
// zeroed) and are drawn from it as a dense row.
func (s *Sampler) topP(row, w []float32, top, scale float32, total, target float64) weighted {
	if s.histogram == nil {
		s.histogram = new(rowmath.Histogram)
	}
	n := rowmath.FindNucleus(s.histogram, w, row, top, scale, total, target, topPBoundary)
	if n.Count+n.Between <= topPBoundary {
		s.keepBetween(row, w, n.Lo, float32(math.Inf(1)))
		return s.cut(target)
	}
	s.keepBetween(row, w, n.Lo, n.Hi)
	s.kept = s.kept[:cutTopP(s.kept, target-n.Mass)] // n.Mass < target: the cut is among these
	d := weighted{kept: s.kept, total: n.Mass}
	for _, c := range s.kept {
		d.total += c.weight
	}
	if n.Count > 0 {
		rowmath.KeepAtLeast(w, row, n.Hi)
		d.dense, d.denseTotal = w, n.Mass
	}
	return d
}

// keepBetween sets s.kept to the tokens of row in [lo, hi), with their weights w.
func (s *Sampler) keepBetween(row, w []float32, lo, hi float32) {
	s.kept = s.appendBetween(s.kept[:0], row, lo, hi)
	for i, c := range s.kept {
		s.kept[i].weight = float64(w[c.id])
	}
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
	return s.draw(s.distribution(logits))
}

// SampleTop draws a token for a sampler with top-k k (or greedy, k = 1)
// from the row's k best logits and their ids, best first with ties to the
// lower id, as the backends' TopK returns them: the token Sample would draw
// from the whole row, with the same random numbers. (A row with NaN logits
// aside: TopK may keep a NaN among the k, which Sample passes over.)
func (s *Sampler) SampleTop(logits []float32, ids []int32) (int32, error) {
	return s.draw(s.topDistribution(logits, ids))
}

// draw chooses a token from d: one random number when more than one token
// can be drawn, none otherwise.
func (s *Sampler) draw(d weighted) (int32, error) {
	switch {
	case d.total == 0:
		return 0, ErrNoToken
	case d.dense == nil && len(d.kept) == 1:
		return d.kept[0].id, nil
	}
	u := s.rng.Float64() * d.total
	if u < d.denseTotal {
		if i := rowmath.SearchCumulative(d.dense, u); i < len(d.dense) {
			return int32(i), nil
		}
		return lastWeighted(d.dense), nil
	}
	u -= d.denseTotal
	for _, c := range d.kept {
		u -= c.weight
		if u < 0 {
			return c.id, nil
		}
	}
	if len(d.kept) == 0 {
		return lastWeighted(d.dense), nil
	}
	return d.kept[len(d.kept)-1].id, nil // rounding left a sliver: the last kept token
}

// lastWeighted is the last id with weight: where a draw that rounding
// carried past the sum lands.
func lastWeighted(w []float32) int32 {
	last := len(w) - 1
	for last > 0 && w[last] == 0 {
		last--
	}
	return int32(last)
}

// Logprobs reports the chosen token's log-probability under the model's own
// distribution (raw logits, padding masked) and the top n alternatives.
func (s *Sampler) Logprobs(logits []float32, chosen int32, n int) StepLogprobs {
	row := logits[:s.valid]
	lse := rowmath.LogSumExp(row)
	logprob := func(v float32) float64 {
		if float64(v) == lse { // an infinite maximum: the softmax's limit, not ∞ − ∞
			return 0
		}
		return float64(v) - lse
	}
	out := StepLogprobs{TokenLogprob: TokenLogprob{ID: chosen, Logprob: logprob(row[chosen])}}
	top := selectTopK(nil, row, n, noFloor)
	slices.SortFunc(top, byRank)
	for _, c := range top {
		out.Top = append(out.Top, TokenLogprob{ID: c.id, Logprob: logprob(c.logit)})
	}
	return out
}

// Argmax returns the index of the largest value, the lowest index on ties,
// ignoring NaN (0 when every value is NaN).
func Argmax(row []float32) int {
	return max(0, rowmath.MaxIndex(row))
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
// is the weakest kept entry. Once the heap is full only entries above the
// root can enter, and rowmath.NextAtLeast skips the others 16 at a time.
func selectTopK(dst []candidate, row []float32, k int, floor float32) []candidate {
	h := dst[:0]
	if k <= 0 {
		return h
	}
	for i := 0; ; i++ {
		bound := floor
		if len(h) == k { // an equal logit comes later, so has a higher id: it does not beat the root
			bound = max(floor, math.Nextafter32(h[0].logit, float32(math.Inf(1))))
		}
		if i += rowmath.NextAtLeast(row[i:], bound); i == len(row) {
			return h
		}
		c := candidate{logit: row[i], id: int32(i)}
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
		if !c.beats(h[0]) { // only a +Inf root lets an equal entry through
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
