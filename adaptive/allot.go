package adaptive

import "math"

// Request is one drafted request's options in a step.
type Request struct {
	// Probs are the predicted acceptance probabilities of its draft-tree
	// nodes in the tree's order (each prefix of that order is the tree of
	// that size): verifying the first n nodes is expected to commit
	// 1 + Σ Probs[:n] tokens, the bonus token included.
	Probs []float64
	// Min is the fewest nodes it may get: 1 when it must speculate, 0 when
	// it may take an autoregressive step instead.
	Min int
}

// Rest is the part of a step the allotment does not choose: the rows of
// the batch's other requests (prompt chunks, autoregressive steps) and the
// tokens they commit.
type Rest struct {
	Rows   int
	Tokens float64
}

// Rate is the expected committed tokens per millisecond of a step: tokens
// over the forward's time for rows, plus overheadMs per speculating request
// (its draft and commit).
func Rate(tokens float64, rows, speculating int, stepMs func(rows int) float64, overheadMs float64) float64 {
	return tokens / math.Max(stepMs(rows)+float64(speculating)*overheadMs, 1e-9)
}

// Allot returns each request's node count: the allotment that maximises
// Rate. It adds nodes one at a time, always the one with the highest
// predicted acceptance among the requests' next nodes (the largest marginal
// gain), and keeps the best allotment along the way, the smallest on ties.
// A request that gets no node decodes autoregressively, so it does not pay
// the overhead of speculating.
func Allot(reqs []Request, rest Rest, stepMs func(rows int) float64, overheadMs float64) []int {
	n := make([]int, len(reqs))
	for i, r := range reqs {
		n[i] = min(r.Min, len(r.Probs))
	}
	tokens, rows, speculating := outcome(reqs, rest, n)
	best := append([]int(nil), n...)
	bestRate := Rate(tokens, rows, speculating, stepMs, overheadMs)
	for {
		next := -1
		for i, r := range reqs {
			if n[i] < len(r.Probs) && (next < 0 || r.Probs[n[i]] > reqs[next].Probs[n[next]]) {
				next = i
			}
		}
		if next < 0 {
			return best
		}
		if n[next] == 0 {
			speculating++
		}
		tokens += reqs[next].Probs[n[next]]
		n[next]++
		rows++
		if rate := Rate(tokens, rows, speculating, stepMs, overheadMs); rate > bestRate {
			bestRate = rate
			copy(best, n)
		}
	}
}

// outcome is an allotment's expected tokens, rows and speculating requests.
func outcome(reqs []Request, rest Rest, n []int) (tokens float64, rows, speculating int) {
	tokens, rows = rest.Tokens, rest.Rows
	for i, r := range reqs {
		tokens += 1 + sum(r.Probs[:n[i]])
		rows += 1 + n[i]
		if n[i] > 0 {
			speculating++
		}
	}
	return tokens, rows, speculating
}

// DraftGains is, for each drafted request, what its draft gains the
// batch, in batch steps: the tokens the batch commits with the allotment n
// over those it commits with the request decoding autoregressively without
// a draft, less the step's time with it (every drafted request paying
// overheadMs, its draft and commit) over the time without. Gains add up:
// over many steps their sum is the steps drafting saved, and a request
// whose draft pays has a positive gain (its Rate is higher with it). A
// request that got no nodes paid for its draft in vain.
func DraftGains(reqs []Request, rest Rest, n []int, stepMs func(rows int) float64, overheadMs float64) []float64 {
	tokens, rows, _ := outcome(reqs, rest, n)
	with := stepMs(rows) + float64(len(reqs))*overheadMs
	gains := make([]float64, len(reqs))
	for i, r := range reqs {
		accepted := sum(r.Probs[:n[i]])
		without := stepMs(rows-n[i]) + float64(len(reqs)-1)*overheadMs
		gains[i] = tokens/(tokens-accepted) - with/math.Max(without, 1e-9)
	}
	return gains
}

func sum(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}

// gainSmoothing is the weight of a draft's gain in a request's running
// gain: about the last 8 drafts decide whether it keeps drafting, so a few
// unlucky drafts (a reply's first tokens, a new line of thought) do not
// stop a request whose drafts pay on the whole.
const gainSmoothing = 1.0 / 8

// optimism is the running gain a request starts from before anything was
// measured: it drafts until a few drafts have shown that drafting does not pay.
const optimism = 1.0

// probeShare is the most of the batch's time that probing drafts (drafts
// made while speculation does not pay, to see whether it pays by now) may
// take; maxInterval bounds the steps between a request's probes.
const (
	probeShare  = 1.0 / 32
	maxInterval = 1024
)

// ProbeInterval is how many steps a request decodes autoregressively
// before its first probe: batch requests, each probing once per interval
// with a draft of draftMs, take at most probeShare of the batch's steps of
// stepMs.
func ProbeInterval(batch int, draftMs, stepMs float64) int {
	steps := float64(max(batch, 1)) * draftMs / (probeShare * math.Max(stepMs, 1e-9))
	return int(math.Min(math.Ceil(math.Max(steps, 1)), maxInterval))
}

// Backoff decides, step by step, whether a request drafts. While the
// running gain of its drafts (see DraftGains) is positive it drafts every
// step; once it is not, the request decodes autoregressively and probes:
// it drafts again after the interval, then after twice that after each
// probe that did not pay either (exponential back-off, up to maxInterval),
// and drafts every step again from a probe that pays.
type Backoff struct {
	gain     float64 // running gain of its drafts (EWMA)
	skip     int     // autoregressive steps left before the next probe
	failures int     // unprofitable drafts since drafting last paid
	interval int     // steps before the first probe, from the latest cost
}

// StartBackoff is a new request's schedule: it drafts at once while drafts
// pay (gain > 0) across the engine's requests, or starts by decoding
// autoregressively for the interval.
func StartBackoff(gain float64, interval int) Backoff {
	b := Backoff{gain: gain, interval: interval}
	if gain <= 0 {
		b.failures, b.skip = 1, interval
	}
	return b
}

// Draft reports whether the request drafts this step.
func (b *Backoff) Draft() bool {
	if b.skip > 0 {
		b.skip--
		return false
	}
	return true
}

// Drafted records this step's draft's gain and the current probe interval
// (ProbeInterval of this step's batch).
func (b *Backoff) Drafted(gain float64, interval int) {
	b.interval = interval
	if b.failures == 0 {
		b.gain += gainSmoothing * (gain - b.gain)
	} else { // a probe: it alone says whether drafting pays again
		b.gain = gain
	}
	if b.gain > 0 {
		b.failures = 0
		return
	}
	b.skip = min(b.interval<<min(b.failures, 10), maxInterval)
	b.failures++
}
