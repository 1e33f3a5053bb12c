package adaptive

import (
	"math"
	"slices"
)

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

// Rest is the part of a step the allotment does not choose: the batch's
// other requests (prompt chunks, autoregressive steps), their rows and the
// tokens they commit.
type Rest struct {
	Seqs   int
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
	gains := make([]float64, len(reqs))
	for i, r := range draftRatios(reqs, rest, n, stepMs, overheadMs) {
		gains[i] = r.tokens - r.time
	}
	return gains
}

// ratios are what a request's draft changes in the batch's step: the
// tokens committed with it over those without it, and the step's time
// with it over the time without.
type ratios struct{ tokens, time float64 }

func draftRatios(reqs []Request, rest Rest, n []int, stepMs func(rows int) float64, overheadMs float64) []ratios {
	tokens, rows, _ := outcome(reqs, rest, n)
	with := stepMs(rows) + float64(len(reqs))*overheadMs
	rs := make([]ratios, len(reqs))
	for i, r := range reqs {
		accepted := sum(r.Probs[:n[i]])
		without := stepMs(rows-n[i]) + float64(len(reqs)-1)*overheadMs
		rs[i] = ratios{tokens / (tokens - accepted), with / math.Max(without, 1e-9)}
	}
	return rs
}

func sum(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}

// recentDrafts is how many of a request's latest drafts predict what its
// next draft gains: a few unlucky drafts (a reply's first tokens, a new line
// of thought) do not stop a request whose drafts pay on the whole.
const recentDrafts = 8

// A drafting request stops only once it has judged a full window of drafts
// (its own, or the engine's it started with: the engine's first request
// does not stop on the first few drafts of its reply, which are the hardest
// to guess), and only when its next draft is expected to lose more than
// stopBelow batch steps: near zero, drafting on costs next to nothing,
// while stopping forgoes a whole probe interval of drafts if the estimate
// was low by chance. A probe is judged alone, and resumes drafting only
// when it is expected to gain more than resumeAbove: one draft is weak
// evidence, and a resumed request drafts until its drafts lose again.
const (
	minEvidence = recentDrafts
	stopBelow   = -1.0 / 8
	resumeAbove = 1.0 / 8
)

// Prediction is a draft's calibrated acceptance probabilities (its nodes',
// in tree order) and, under a Choice, the drafter that made it, whose own
// draft time the draft is judged with (nil: the policy's draft time).
type Prediction struct {
	Probs   []float64
	Drafter *DrafterStats
}

// draftMs is the prediction's draft time: its drafter's, else policyMs.
func (p Prediction) draftMs(policyMs float64) float64 {
	if p.Drafter == nil {
		return policyMs
	}
	return p.Drafter.DraftMs()
}

// ExpectedGain is what a request's next draft is expected to gain the
// batch, in batch steps (as DraftGains): the mean, over its recent drafts'
// calibrated predictions, of the gain each would have with its best
// allotment beside the rest of this batch (rest). Every draft is judged in
// the batch at hand, not in the one it was made in, so a request stops
// drafting at once when the batch grows to where drafting no longer pays;
// and each with its own best allotment, which is what drafting every step
// gets (the mean of the best allotments, not the best allotment of the
// mean draft); and each at its own drafter's draft time (draftMs for a
// prediction of no drafter), so that a window of one drafter's drafts is
// not judged at another's cost.
func ExpectedGain(recent []Prediction, rest Rest, stepMs func(rows int) float64, commitMs, draftMs float64) float64 {
	return expected(recent, rest, stepMs, commitMs, draftMs, func(reqs []Request, n []int, draftMs float64) float64 {
		return DraftGains(reqs, rest, n, stepMs, draftMs+commitMs)[0]
	})
}

// expected is the mean, over recent drafts, of judge on each (a request of
// one draft) with its best allotment n (0 for none) and its draft time.
func expected(recent []Prediction, rest Rest, stepMs func(rows int) float64, commitMs, draftMs float64, judge func(reqs []Request, n []int, draftMs float64) float64) float64 {
	if len(recent) == 0 {
		return 0
	}
	total := 0.0
	for _, p := range recent {
		reqs := []Request{{Probs: p.Probs}}
		n := Allot(reqs, rest, stepMs, commitMs) // the draft made: only the commit weighs against nodes
		total += judge(reqs, n, p.draftMs(draftMs))
	}
	return total / float64(len(recent))
}

// probeShare is the most of the batch's time that probing drafts (drafts
// made while speculation does not pay, to see whether it pays by now) may
// take; maxInterval bounds the steps between a request's probes;
// maxRelapses bounds the back-off (delay).
const (
	probeShare  = 1.0 / 32
	maxInterval = 1024
	maxRelapses = 6
)

// ProbeInterval is how many steps a request decodes autoregressively
// before its first probe: batch requests, each probing once per interval
// with a draft of draftMs, take at most probeShare of the batch's steps of
// stepMs.
func ProbeInterval(batch int, draftMs, stepMs float64) int {
	steps := float64(max(batch, 1)) * draftMs / (probeShare * math.Max(stepMs, 1e-9))
	return int(math.Min(math.Ceil(math.Max(steps, 1)), maxInterval))
}

// delay is how many request steps the next probe waits after so many
// relapses: a quarter of the interval after none (drafting paid for a while
// before it stopped: a reply's uncertain stretch may be over soon), then
// twice as long after each (exponential back-off: half the interval, the
// interval, twice it, ... up to 16 intervals, where probing takes 1/512 of
// the batch's time; each request still probes after maxInterval of its own
// steps). Capped at maxInterval as well, the engine's schedule probed about
// once per 1,024 request steps where drafting never paid (held-out prompts
// at concurrency 4: 20 probes in 9 passes, each a catch-up draft of 2.5
// plain steps). A relapse is a losing probe,
// or drafting resumed by a paying probe that stopped again before it had
// drafted a full window: where one draft pays now and then but drafting on
// does not (held-out prompts at concurrency 4 on a CPU), a schedule that
// came back at a quarter interval after every paying probe spent 5-10 % of
// the time on probes' catch-up drafts.
func delay(interval, relapses int) int {
	return max(1, interval<<min(relapses, maxRelapses)/4)
}

// Backoff is one request's drafting state. While its next draft is
// expected to pay (ExpectedGain over its recent drafts) it drafts every
// step; once not, it stops: it decodes autoregressively and drafts only to
// probe, when the engine's probe schedule (Probes) gives it the next
// probe, and drafts every step again from a probe that pays (by
// resumeAbove). A probe is judged alone: the drafts before the stop are
// forgotten.
type Backoff struct {
	recent  []Prediction // its latest drafts' calibrated predictions, oldest first
	judged  int          // drafts it has judged by: its own and those it started with
	resumed bool         // a probe resumed its drafting
	run     int          // its drafts since it started, or since a probe resumed it
	stopped bool         // it drafts only to probe
	probing bool         // its draft in flight is a probe
	waited  int          // its steps without a draft since its last draft
}

// StartBackoff is a new request's schedule: it drafts at once, with the
// engine's recent drafts as its own, while a draft is expected to pay
// (gain > 0); otherwise it starts stopped, waiting for the engine's next
// probe. Either way the engine's drafts count as judged, so a request that
// starts stopped and is resumed by a probe stops on its next losing draft,
// as any resumed request does (judging a fresh window instead, it drafted
// on 7 more times where drafting lost, and then its stop cleared the
// schedule's relapses).
func StartBackoff(recent []Prediction, gain float64) Backoff {
	if gain <= 0 {
		return Backoff{stopped: true, judged: len(recent)}
	}
	return Backoff{recent: slices.Clone(recent), judged: len(recent)}
}

// record adds a draft's calibrated predictions to the recent ones.
func (b *Backoff) record(p Prediction) {
	b.recent = append(b.recent, p)
	b.judged++
	b.run++
	if len(b.recent) > recentDrafts {
		b.recent = slices.Delete(b.recent, 0, 1)
	}
}

// Probes is an engine's probe schedule, which its stopped requests share:
// one probe every so many request steps decoded without a draft (delay),
// backing off while probes lose or drafting they resume relapses. Counted
// across requests, a back-off outlives the request it began in: where
// speculation does not pay, a stream of short requests does not pay a
// probe each, and probing takes a vanishing share of the time. A due probe
// goes to the first stopped request that asks, and a request that waited
// maxInterval of its own steps probes anyway: every request whose drafts
// would pay is found within that, and the drafter context it gathers
// meanwhile (the hidden states of the steps since its last draft) stays
// bounded.
type Probes struct {
	steps    int // request steps decoded without a draft so far
	due      int // the step count from which the next probe is made
	relapses int // losing probes and short-lived resumes since drafting last paid for a full window
	report   ScheduleReport
}

// ScheduleReport is what the probe schedule did so far: the probes drafted,
// those that resumed drafting, the drafting requests that stopped, and the
// relapses its back-off stands at (each of the first maxRelapses doubles
// the wait for the next probe). A schedule stuck at its longest back-off
// while speculation pays shows as relapses at maxRelapses or more with few
// resumes.
type ScheduleReport struct {
	Probes   int `json:"probes"`
	Resumes  int `json:"resumes"`
	Stops    int `json:"stops"`
	Relapses int `json:"relapses"`
}

// draft reports whether the request drafts this step: every step unless it
// stopped, then only when it takes the engine's next probe. A probe taken,
// the next waits until this one is judged (judge), or maxInterval steps if
// it never is (its request ended first).
func (s *Probes) draft(b *Backoff) bool {
	if !b.stopped {
		return true
	}
	due := s.steps >= s.due
	if b.probing = due || b.waited >= maxInterval; b.probing {
		if due {
			s.due = s.steps + maxInterval
		}
		b.waited = 0
		s.report.Probes++
		return true
	}
	s.steps++
	b.waited++
	return false
}

// judge records a drafted request's expected gain from its next draft,
// after this step's draft (see Backoff.record), with the current probe
// interval (ProbeInterval of this step's batch). A drafting request stops
// once it has judged a full window of drafts and expects a loss over
// stopBelow; a probe resumes drafting when it expects a gain over
// resumeAbove. The schedule backs off after a relapse: a losing probe, or
// drafting a probe resumed that stopped again within a window of drafts
// (the probe's promise was not kept). A full window of drafting (it paid,
// for a while at least) clears the relapses as soon as it is drafted, not
// at its stop: a request that drafts to its end never stops, and where
// requests are short and speculation pays by a few per cent, the relapses
// of losing probes at requests' first drafts then piled up over hundreds
// of requests (the back-off at its longest, drafting on a few per cent of
// the steps). After any stop but a relapse the next probe comes the delay
// on, unless it is due sooner.
func (s *Probes) judge(b *Backoff, gain float64, interval int) {
	if !b.stopped && !b.probing && b.run == recentDrafts {
		s.relapses = 0
	}
	switch {
	case b.probing:
		b.probing = false
		if gain > resumeAbove {
			s.report.Resumes++
			b.stopped, b.resumed, b.run = false, true, 0
			s.due = s.steps + delay(interval, s.relapses)
			return
		}
		b.recent = nil
		s.relapse(interval)
	case !b.stopped && gain < stopBelow && b.judged >= minEvidence:
		b.stopped, b.recent = true, nil
		s.report.Stops++
		if b.resumed && b.run < recentDrafts {
			s.relapse(interval)
			return
		} // else it drafted a full window (relapses cleared), or started drafting on the engine's drafts, which did not hold for it: no evidence either way
		if at := s.steps + delay(interval, s.relapses); s.due <= s.steps || at < s.due {
			s.due = at
		}
	}
}

// relapse backs the schedule off one step further.
func (s *Probes) relapse(interval int) {
	s.relapses++
	s.due = s.steps + delay(interval, s.relapses)
}

// Report is the schedule's history and back-off so far.
func (s *Probes) Report() ScheduleReport {
	r := s.report
	r.Relapses = s.relapses
	return r
}
