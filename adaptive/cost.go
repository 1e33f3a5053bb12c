// Package adaptive chooses, before each verify, how many draft-tree nodes
// every speculating request gets: the allotment that maximises expected
// committed tokens per second, given a measured cost model (the target's
// step time as a function of verify rows, and the drafter's time) and the
// drafter's predicted acceptance, calibrated online against what the target
// accepted. It only changes which proposal is verified, so speculation
// stays lossless.
package adaptive

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// A measurement below the estimate replaces it; one above moves it by
// slowdown of the difference. Other programs' load only ever adds time, and
// in bursts, so the estimates track the uncontended cost and drift up only
// under a lasting slowdown; since every point of the curve is estimated
// alike, their ratios, which decide the allotment, stay consistent.
const slowdown = 0.05

// update moves an estimate by a new measurement.
func update(estimate, ms float64) float64 {
	if ms < estimate {
		return ms
	}
	return estimate + slowdown*(ms-estimate)
}

// Point is one point of the step-time curve.
type Point struct {
	Rows int     `json:"rows"`
	Ms   float64 `json:"ms"`
}

// CostModel is the measured cost of a decode step: the target's forward
// time per number of rows it computes (verify rows of every request in the
// batch), and the drafter's time per draft. Safe for concurrent use.
type CostModel struct {
	mu      sync.Mutex
	points  []Point // sorted by rows; Ms is the estimate (see update)
	draftMs float64 // estimate; 0 until measured
}

// ObserveStep records a forward over rows rows that took d.
func (c *CostModel) ObserveStep(rows int, d time.Duration) {
	if rows < 1 {
		return
	}
	ms := float64(d.Nanoseconds()) / 1e6
	c.mu.Lock()
	defer c.mu.Unlock()
	i, found := slices.BinarySearchFunc(c.points, rows, func(p Point, r int) int { return p.Rows - r })
	if found {
		c.points[i].Ms = update(c.points[i].Ms, ms)
		return
	}
	c.points = slices.Insert(c.points, i, Point{Rows: rows, Ms: ms})
}

// ObserveDraft records one drafter call that took d.
func (c *CostModel) ObserveDraft(d time.Duration) {
	ms := float64(d.Nanoseconds()) / 1e6
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draftMs == 0 {
		c.draftMs = ms
		return
	}
	c.draftMs = update(c.draftMs, ms)
}

// Curve returns a copy of the measured points and the drafter's time.
func (c *CostModel) Curve() (points []Point, draftMs float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.points), c.draftMs
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

// String prints the curve's points, as `generate --json` and /metrics show them.
func (c *CostModel) String() string {
	points, draft := c.Curve()
	var b strings.Builder
	for i, p := range points {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%d:%.3gms", p.Rows, p.Ms)
	}
	return fmt.Sprintf("step [%s] draft %.3gms", b.String(), draft)
}
