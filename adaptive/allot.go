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

// PaysToDraft says, for each request, whether speculating for it pays: the
// batch's Rate with its nodes of allotment n and its overhead (draft and
// commit) exceeds the Rate with it decoding autoregressively instead.
func PaysToDraft(reqs []Request, rest Rest, n []int, stepMs func(rows int) float64, overheadMs float64) []bool {
	pays := make([]bool, len(reqs))
	tokens, rows, spec := outcome(reqs, rest, n)
	with := Rate(tokens, rows, spec, stepMs, overheadMs)
	for i, r := range reqs {
		if n[i] > 0 {
			without := Rate(tokens-sum(r.Probs[:n[i]]), rows-n[i], spec-1, stepMs, overheadMs)
			pays[i] = with > without
		}
	}
	return pays
}

func sum(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}

// maxSkip is the most steps a request decodes autoregressively before it
// drafts again to see whether speculation pays by now.
const maxSkip = 16

// Backoff spaces out a request's drafting while speculation does not pay:
// after each draft that got no nodes it skips twice as many steps as the
// last time (1, 2, 4, ... up to maxSkip), and it drafts every step again
// once a draft gets nodes.
type Backoff struct{ skip, last int }

// Draft reports whether the request drafts this step.
func (b *Backoff) Draft() bool {
	if b.skip > 0 {
		b.skip--
		return false
	}
	return true
}

// Drafted records whether this step's draft got nodes.
func (b *Backoff) Drafted(paid bool) {
	if paid {
		b.last = 0
		return
	}
	b.last = min(max(1, 2*b.last), maxSkip)
	b.skip = b.last
}
