// Package adaptive chooses, before each verify, how many draft-tree nodes
// every speculating request gets: the allotment that maximises expected
// committed tokens per second, given a measured cost model (the target's
// step time as a function of verify rows, and the drafter's time) and the
// drafter's predicted acceptance, calibrated online against what the target
// accepted. It only changes which proposal is verified, so speculation
// stays lossless.
package adaptive

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// window is how many recent measurements each estimate keeps. An estimate
// is their lower quartile: other programs' load only ever slows a step, and
// comes in bursts, so a low quantile is nearest the step's own cost; and the
// order statistic taken, the ((n+1)/4)-th smallest of n, sits at about the
// same quantile (a quarter) whether a point was measured 3 or 16 times, so
// points measured every step (one row, the drafter) and points measured
// rarely (large trees) stay comparable, as they would not with a minimum.
const window = 16

// plainWindow is the plain steps' window. They are measured every step
// while no request drafts, and not at all while all do, so a burst of slow
// steps (10-30 steps at twice the time, now and then on a shared machine)
// just before a drafting stretch would stand for the plain step
// throughout it, making drafting look cheap and the stretch last: over 64
// the lower quartile rides such a burst out.
const plainWindow = 64

// samples is one estimate's recent measurements, a ring, each with a
// weight (1 but for the batch factors, see ObserveStep).
type samples struct {
	ms, weights []float64
	next        int
}

func (s *samples) add(ms float64) { s.push(ms, 1, window) }

// push adds a measurement of a weight to a ring of size measurements.
func (s *samples) push(ms, weight float64, size int) {
	if len(s.ms) < size {
		s.ms, s.weights = append(s.ms, ms), append(s.weights, weight)
		return
	}
	s.ms[s.next], s.weights[s.next] = ms, weight
	s.next = (s.next + 1) % size
}

// estimate is the weighted lower quartile, 0 without measurements: the
// smallest measurement at which the measurements up to it hold the share
// of the total weight that the ((n+1)/4)-th smallest of n equal ones holds.
func (s *samples) estimate() float64 {
	n := len(s.ms)
	if n == 0 {
		return 0
	}
	order := make([]int, n)
	total := 0.0
	for i := range order {
		order[i] = i
		total += s.weights[i]
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(s.ms[a], s.ms[b]) })
	quantile := float64(max(1, (n+1)/4)) / float64(n) * total * (1 - 1e-9) // the tolerance keeps equal weights' sums exact
	below := 0.0
	for _, i := range order {
		if below += s.weights[i]; below >= quantile {
			return s.ms[i]
		}
	}
	return s.ms[order[n-1]]
}

// Point is one point of the step-time curve.
type Point struct {
	Rows int     `json:"rows"`
	Ms   float64 `json:"ms"`
}

// CostModel is the measured cost of a decode step: the target's forward
// time, and what each speculating request adds: the drafter's time per
// draft and the commit of its accepted path (GDN state and KV compaction).
// A forward's time depends on its sequences as well as its rows (each
// sequence has its own attention and recurrent state to go through, so four
// sequences of one row cost more than one sequence of four): it is modelled
// as a plain decoding step's time for the batch's sequences (one row each)
// plus what the rows beyond one per sequence (verify nodes, prompt chunks)
// add, as they add to one sequence's step, times the batch's factor (on the
// default pair's CPU, rows beside three other sequences cost about a third
// more than alone). Safe for concurrent use.
type CostModel struct {
	mu sync.Mutex
	// plain are plain decoding steps' times by sequences (= rows); extra
	// what rows beyond the one row of a single sequence added to its step,
	// by their number; factor, by sequences (at least 2), what rows beyond
	// one per sequence added to a step over what extra says they add alone.
	plain, extra, factor curve
	draft, commit        samples
	// catchUp are drafts that also took in the context of autoregressive
	// steps: the estimate until a steady draft is seen.
	catchUp samples
	// overhead is a plain decode step's time outside the forward, its
	// drafts and its commits (sampling, emitting, scheduling): from one
	// decode forward's end (lastEnd; zero after other forwards) to the next
	// one's start, less the drafts and commits timed in between (inside),
	// where neither step speculated. Where one did, what that time has
	// beyond a plain step's overhead is its speculating requests'
	// bookkeeping (the policy's allotment, the tree walk, calibrating), per
	// request: a cost of speculating, counted with the commit (Costs). A
	// stretch where every request drafts would otherwise measure only its
	// own overhead, charge it to plain steps too, and make drafting look
	// cheap by as much (0.1-0.2 ms a step against 0.03 on the default pair's
	// CPU).
	overhead, bookkeeping samples
	lastEnd               time.Time
	lastSpeculating       int
	inside                time.Duration
}

// curve is measurements by a count (rows or sequences).
type curve struct {
	keys  []int // ascending
	steps []samples
}

// add adds a count's measurement of a weight to its ring of size.
func (c *curve) add(key int, ms, weight float64, size int) {
	i, found := slices.BinarySearch(c.keys, key)
	if !found {
		c.keys = slices.Insert(c.keys, i, key)
		c.steps = slices.Insert(c.steps, i, samples{})
	}
	c.steps[i].push(ms, weight, size)
}

// points are the estimates of the counts measured at least minSamples times.
func (c *curve) points() []Point {
	var points []Point
	for i, k := range c.keys {
		if len(c.steps[i].ms) >= minSamples {
			points = append(points, Point{Rows: k, Ms: c.steps[i].estimate()})
		}
	}
	return points
}

// ObserveStep records a forward over rows rows of seqs sequences that took
// d. A step with rows beyond one per sequence measures what they add over
// the plain step of as many sequences, as estimated so far (not before one
// is): alone, by their number (extra); beside other sequences, as a factor
// of what they add alone (not before that is measured), weighted by that:
// a verify of a node or two adds next to nothing to a step's time, so its
// ratio is mostly the steps' noise, and probes verify one node. Counted
// alike, such ratios (half of them near 0) made the factor's lower quartile
// a fifth of the true one at concurrency 4 on a CPU, and a 32-node tree
// that took 3 ms was predicted at 0.9.
func (c *CostModel) ObserveStep(seqs, rows int, d time.Duration) {
	if seqs < 1 || rows < seqs {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if rows == seqs {
		c.plain.add(seqs, millis(d), 1, plainWindow)
		return
	}
	plain := Monotone(c.plain.points())
	if len(plain) == 0 {
		return
	}
	added := max(0, millis(d)-StepMs(plain, seqs))
	if seqs == 1 {
		c.extra.add(rows-1, added, 1, window)
	} else if alone := extraMs(Monotone(c.extra.points()), rows-seqs); alone > 0 {
		c.factor.add(seqs, added/alone, alone, window)
	}
}

// ObserveDraft records one drafter call that took d. A steady draft took
// in no more context than one verify commits, as when drafting every step;
// one after autoregressive steps also caught up on their context, a debt
// that any later draft pays, so only steady drafts say what drafting the
// next step costs (the others do until a steady one is seen).
func (c *CostModel) ObserveDraft(d time.Duration, steady bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if steady {
		c.draft.add(millis(d))
	} else {
		c.catchUp.add(millis(d))
	}
	c.inside += d
}

// ForwardStarts marks a forward's start at now, with speculating of its
// requests verifying drafts: for a decode forward, the end of the step
// overhead since the previous decode forward.
func (c *CostModel) ForwardStarts(now time.Time, decoding bool, speculating int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if decoding && !c.lastEnd.IsZero() {
		ms := max(0, millis(now.Sub(c.lastEnd)-c.inside))
		if n := max(speculating, c.lastSpeculating); n == 0 {
			c.overhead.add(ms)
		} else {
			c.bookkeeping.add(max(0, ms-c.overhead.estimate()) / float64(n))
		}
	}
	c.lastEnd, c.inside = time.Time{}, 0
}

// ForwardEnds marks a forward's end at now, with speculating of its
// requests verifying drafts; only a decode forward starts a step overhead
// to time.
func (c *CostModel) ForwardEnds(now time.Time, decoding bool, speculating int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if decoding {
		c.lastEnd, c.lastSpeculating = now, speculating
	}
}

// OverheadMs is the estimated plain step's time outside the forward.
func (c *CostModel) OverheadMs() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.overhead.estimate()
}

// ObserveCommit records one verify's commit that took d.
func (c *CostModel) ObserveCommit(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commit.add(millis(d))
	c.inside += d
}

func millis(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// minSamples is how many measurements a row count needs to be a point of
// the curve: one step slowed by other programs would otherwise stand for
// its row count until measured again.
const minSamples = 3

// Costs are a cost model's estimates at one time.
type Costs struct {
	// Plain is a plain decoding step's time by rows (one per sequence);
	// Extra what rows beyond its one add to a single sequence's step, by
	// their number; both are non-decreasing (Monotone). Factor is, by
	// sequences, how many times that rows beyond one per sequence add to a
	// step of that many (Ms holds the factor).
	Plain, Extra, Factor []Point
	// DraftMs is a draft's time, CommitMs what else a speculating request
	// costs a step: its commit and bookkeeping. 0 until measured.
	DraftMs, CommitMs float64
	// ProbeMs is a probe's draft: one after autoregressive steps, which
	// takes in their context too (DraftMs until one is measured).
	ProbeMs float64
}

// Costs returns the current estimates: the curves' counts measured at least
// minSamples times, and the drafter's and the commit's time.
func (c *CostModel) Costs() Costs {
	c.mu.Lock()
	defer c.mu.Unlock()
	draftMs := c.draft.estimate()
	if len(c.draft.ms) == 0 {
		draftMs = c.catchUp.estimate()
	}
	return Costs{Plain: Monotone(c.plain.points()), Extra: Monotone(c.extra.points()), Factor: c.factor.points(),
		DraftMs: draftMs, CommitMs: c.commit.estimate() + c.bookkeeping.estimate(), ProbeMs: max(draftMs, c.catchUp.estimate())}
}

// StepMs predicts a forward's time over rows rows of seqs sequences: the
// plain step of seqs sequences and what the rows beyond them add (from
// none at none, along the measured points) times the batch's factor (1
// alone, along the measured factors, the nearest measured beyond them).
func (c Costs) StepMs(seqs, rows int) float64 {
	plain := StepMs(c.Plain, seqs)
	if rows <= seqs {
		return plain
	}
	return plain + factorAt(c.Factor, seqs)*extraMs(c.Extra, rows-seqs)
}

// factorAt is the batch factor of seqs sequences: 1 alone, linear between
// the measured factors, the last measured beyond them.
func factorAt(factors []Point, seqs int) float64 {
	points := append([]Point{{1, 1}}, factors...)
	if last := points[len(points)-1]; seqs >= last.Rows {
		return last.Ms
	}
	return StepMs(points, seqs)
}

// extraMs is what extra rows add to one sequence's step, from none at none.
func extraMs(extra []Point, rows int) float64 {
	return StepMs(append([]Point{{0, 0}}, extra...), rows)
}

// OneSequence is the predicted step time of one sequence by rows, at 1 and
// at each measured count of extra rows: the curve's key points.
func (c Costs) OneSequence() []Point {
	if len(c.Plain) == 0 {
		return nil
	}
	points := []Point{{1, c.StepMs(1, 1)}}
	for _, p := range c.Extra {
		points = append(points, Point{1 + p.Rows, c.StepMs(1, 1+p.Rows)})
	}
	return points
}

// StepMs predicts a forward's time over rows rows from the measured points:
// linear between them, along the last two beyond them (never decreasing),
// flat with one point, 0 with none.
func StepMs(points []Point, rows int) float64 {
	switch len(points) {
	case 0:
		return 0
	case 1:
		return points[0].Ms
	}
	i, found := slices.BinarySearchFunc(points, rows, func(p Point, r int) int { return p.Rows - r })
	if found {
		return points[i].Ms
	}
	lo, hi := points[max(0, min(i-1, len(points)-2))], points[max(1, min(i, len(points)-1))]
	slope := (hi.Ms - lo.Ms) / float64(hi.Rows-lo.Rows)
	switch i {
	case 0: // below the measured rows
		return max(0, lo.Ms-max(slope, 0)*float64(lo.Rows-rows))
	case len(points): // beyond them: never predict a faster step for more rows
		return hi.Ms + max(slope, 0)*float64(rows-hi.Rows)
	}
	return lo.Ms + slope*float64(rows-lo.Rows)
}

// Monotone is the non-decreasing curve nearest the points (least squares,
// by pooling adjacent violators): a step never gets faster with more rows,
// so a point below a smaller one is measurement noise (a loaded machine).
func Monotone(points []Point) []Point {
	type block struct {
		sum float64
		n   int
	}
	var blocks []block
	for _, p := range points {
		blocks = append(blocks, block{p.Ms, 1})
		for k := len(blocks) - 1; k > 0 && blocks[k-1].sum/float64(blocks[k-1].n) > blocks[k].sum/float64(blocks[k].n); k-- {
			blocks[k-1].sum += blocks[k].sum
			blocks[k-1].n += blocks[k].n
			blocks = blocks[:k]
		}
	}
	out := slices.Clone(points)
	i := 0
	for _, b := range blocks {
		for range b.n {
			out[i].Ms = b.sum / float64(b.n)
			i++
		}
	}
	return out
}

// String prints the curves' points, as `generate --json` and /metrics show them.
func (c *CostModel) String() string {
	costs := c.Costs()
	return fmt.Sprintf("plain [%s] extra rows [%s] factor [%s] draft %.3gms commit %.3gms", pointsText(costs.Plain, "ms"), pointsText(costs.Extra, "ms"), pointsText(costs.Factor, "x"), costs.DraftMs, costs.CommitMs)
}

func pointsText(points []Point, unit string) string {
	var b strings.Builder
	for i, p := range points {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%d:%.3g%s", p.Rows, p.Ms, unit)
	}
	return b.String()
}
