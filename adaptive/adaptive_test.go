package adaptive

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestStepMs(t *testing.T) {
	curve := []Point{{1, 10}, {3, 14}, {9, 20}}
	for _, c := range []struct {
		points []Point
		rows   int
		want   float64
	}{
		{nil, 5, 0},
		{[]Point{{4, 7}}, 30, 7},
		{curve, 1, 10},
		{curve, 2, 12},                       // between 1 and 3
		{curve, 6, 17},                       // between 3 and 9
		{curve, 9, 20},                       // measured
		{curve, 15, 26},                      // beyond: the slope of the last two points
		{[]Point{{2, 10}, {4, 8}}, 8, 8},     // a faster larger step measured: never extrapolate faster still
		{[]Point{{2, 10}, {4, 12}}, 1, 9},    // below the first point
		{[]Point{{2, 10}, {4, 30}}, 1, 0},    // never negative
		{[]Point{{2, 10}, {4, 8}}, 3, 9},     // inside, as measured
		{[]Point{{8, 10}, {16, 10}}, 32, 10}, // bandwidth-bound: flat
	} {
		if got := StepMs(c.points, c.rows); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("StepMs(%v, %d) = %v, want %v", c.points, c.rows, got, c.want)
		}
	}
}

func TestMonotone(t *testing.T) {
	for _, c := range []struct{ in, want []float64 }{
		{nil, nil},
		{[]float64{1, 2, 3}, []float64{1, 2, 3}},
		{[]float64{1, 3, 2}, []float64{1, 2.5, 2.5}},
		{[]float64{5, 1, 3, 2}, []float64{2.75, 2.75, 2.75, 2.75}},
		{[]float64{1, 4, 2, 3, 6}, []float64{1, 3, 3, 3, 6}},
	} {
		var in []Point
		for i, ms := range c.in {
			in = append(in, Point{Rows: 1 + 4*i, Ms: ms})
		}
		got := Monotone(in)
		for i := range got {
			if got[i].Rows != in[i].Rows || !near(got[i].Ms, c.want[i]) {
				t.Errorf("Monotone(%v) = %v, want ms %v", c.in, got, c.want)
				break
			}
		}
	}
}

func TestCostModelMedians(t *testing.T) {
	var c CostModel
	for _, ms := range []time.Duration{10, 30, 11} { // a burst of load in between
		c.ObserveStep(4, ms*time.Millisecond)
	}
	c.ObserveStep(1, 6*time.Millisecond)
	c.ObserveStep(1, 5*time.Millisecond)
	c.ObserveStep(0, time.Second) // no rows: ignored
	c.ObserveDraft(3 * time.Millisecond)
	c.ObserveCommit(2 * time.Millisecond)
	points, draft, commit := c.Curve()
	want := []Point{{1, 5.5}, {4, 11}}
	if !slices.EqualFunc(points, want, func(a, b Point) bool { return a.Rows == b.Rows && near(a.Ms, b.Ms) }) || !near(draft, 3) || !near(commit, 2) {
		t.Errorf("curve %v draft %v commit %v, want %v, 3 and 2", points, draft, commit, want)
	}
	if s := c.String(); s != "step [1:5.5ms 4:11ms] draft 3ms commit 2ms" {
		t.Errorf("String() = %q", s)
	}
	// Only the last window measurements count: a lasting slowdown is followed.
	for range window {
		c.ObserveDraft(50 * time.Millisecond)
	}
	if _, draft, _ := c.Curve(); draft != 50 {
		t.Errorf("after %d drafts of 50 ms the estimate is %v", window, draft)
	}
}

func TestCostModelStepOverhead(t *testing.T) {
	var c CostModel
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	c.ForwardStarts(at(0), false) // a prompt chunk
	c.ForwardEnds(at(10), false)
	c.ForwardStarts(at(15), true) // the first decode step: no decode step before it
	c.ForwardEnds(at(20), true)
	c.ObserveDraft(2 * time.Millisecond)
	c.ObserveCommit(time.Millisecond)
	c.ForwardStarts(at(24), true) // 4 ms since the last forward, 3 of them drafting and committing
	c.ForwardEnds(at(30), true)
	c.ForwardStarts(at(32), true)
	c.ForwardEnds(at(40), false) // a batch with a prompt chunk: the next gap is not a step's
	c.ForwardStarts(at(90), true)
	if got := c.OverheadMs(); !near(got, 1.5) { // the median of 1 and 2
		t.Errorf("step overhead %v ms, want 1.5", got)
	}
}

func linearCost(fixed, perRow float64) func(int) float64 {
	return func(rows int) float64 { return fixed + perRow*float64(rows) }
}

func TestAllotPicksTheArgmax(t *testing.T) {
	decreasing := []float64{0.9, 0.8, 0.6, 0.3, 0.1, 0.05}
	flat := func(int) float64 { return 10 }
	for _, c := range []struct {
		name       string
		reqs       []Request
		rest       Rest
		stepMs     func(int) float64
		overheadMs float64
		want       []int
	}{
		// T = 10 + r: n nodes commit 1+Σp over 11+n+... ; the rate peaks
		// where the next node's p falls below the current rate × 1 ms.
		{"one request, CPU-like cost", []Request{{Probs: decreasing}}, Rest{}, linearCost(10, 1), 0, []int{4}},
		{"bandwidth-bound: every node is free", []Request{{Probs: decreasing}}, Rest{}, flat, 0, []int{6}},
		{"nothing pays: autoregressive", []Request{{Probs: []float64{0.05, 0.01}}}, Rest{}, linearCost(1, 1), 0, []int{0}},
		{"nothing pays but it must speculate", []Request{{Probs: []float64{0.05, 0.01}, Min: 1}}, Rest{}, linearCost(1, 1), 0, []int{1}},
		{"the drafter costs more than it wins", []Request{{Probs: decreasing}}, Rest{}, linearCost(10, 0.1), 50, []int{0}},
		{"an off-topic request gets nothing, a confident one much",
			[]Request{{Probs: []float64{0.02, 0.01, 0.01}}, {Probs: decreasing}}, Rest{}, linearCost(10, 1), 0, []int{0, 4}},
		{"a busy batch leaves less room", []Request{{Probs: decreasing}}, Rest{Rows: 60, Tokens: 60}, linearCost(10, 1), 0, []int{1}},
		{"no drafts", []Request{{}}, Rest{}, flat, 0, []int{0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Allot(c.reqs, c.rest, c.stepMs, c.overheadMs)
			if !slices.Equal(got, c.want) {
				t.Errorf("Allot = %v, want %v", got, c.want)
			}
			if want := bruteForce(c.reqs, c.rest, c.stepMs, c.overheadMs); !near(rateOf(c.reqs, c.rest, got, c.stepMs, c.overheadMs), want) {
				t.Errorf("allotment %v rates %v, the best allotment %v", got, rateOf(c.reqs, c.rest, got, c.stepMs, c.overheadMs), want)
			}
		})
	}
}

// TestAllotMatchesExhaustiveSearch checks random batches against every
// possible allotment: with each request's probabilities decreasing (as path
// probabilities along a chain are) and a free drafter, the greedy marginal
// allotment is the optimum.
func TestAllotMatchesExhaustiveSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		reqs := make([]Request, 1+rng.IntN(3))
		for i := range reqs {
			p := rng.Float64()
			for range rng.IntN(6) {
				reqs[i].Probs = append(reqs[i].Probs, p)
				p *= rng.Float64()
			}
			reqs[i].Min = rng.IntN(2)
		}
		fixed, perRow := rng.Float64()*20, rng.Float64()*3
		stepMs := linearCost(fixed, perRow)
		rest := Rest{Rows: rng.IntN(4)}
		rest.Tokens = float64(rest.Rows)
		got := Allot(reqs, rest, stepMs, 0)
		if r, want := rateOf(reqs, rest, got, stepMs, 0), bruteForce(reqs, rest, stepMs, 0); !near(r, want) {
			t.Fatalf("trial %d: %+v cost %v+%v·rows: allotment %v rates %v, the best %v", trial, reqs, fixed, perRow, got, r, want)
		}
	}
}

func TestPaysToDraft(t *testing.T) {
	strong, weak := []float64{0.9, 0.8, 0.7}, []float64{0.3}
	reqs := []Request{{Probs: strong}, {Probs: weak}, {Probs: strong}}
	n := []int{3, 1, 0}
	cost := linearCost(10, 1)
	// With the drafter at 2 ms: the strong request's 2.4 tokens pay for it,
	// the weak one's 0.3 do not; the third got no nodes.
	got := PaysToDraft(reqs, Rest{}, n, cost, 2)
	if want := []bool{true, false, false}; !slices.Equal(got, want) {
		t.Errorf("PaysToDraft = %v, want %v", got, want)
	}
	rate := func(n []int) float64 { return rateOf(reqs, Rest{}, n, cost, 2) }
	for i := range reqs {
		without := slices.Clone(n)
		without[i] = 0
		if n[i] > 0 && got[i] != (rate(n) > rate(without)) {
			t.Errorf("request %d: pays %v, rate with %v, without %v", i, got[i], rate(n), rate(without))
		}
	}
}

// rateOf is the expected tokens per ms of an allotment, computed directly.
func rateOf(reqs []Request, rest Rest, n []int, stepMs func(int) float64, overheadMs float64) float64 {
	tokens, rows, spec := rest.Tokens, rest.Rows, 0
	for i, r := range reqs {
		tokens += 1
		rows += 1 + n[i]
		for _, p := range r.Probs[:n[i]] {
			tokens += p
		}
		if n[i] > 0 {
			spec++
		}
	}
	return tokens / (stepMs(rows) + float64(spec)*overheadMs)
}

// bruteForce is the best rate over every allotment within the bounds.
func bruteForce(reqs []Request, rest Rest, stepMs func(int) float64, overheadMs float64) float64 {
	n := make([]int, len(reqs))
	best := math.Inf(-1)
	var rec func(i int)
	rec = func(i int) {
		if i == len(reqs) {
			best = math.Max(best, rateOf(reqs, rest, n, stepMs, overheadMs))
			return
		}
		for k := min(reqs[i].Min, len(reqs[i].Probs)); k <= len(reqs[i].Probs); k++ {
			n[i] = k
			rec(i + 1)
		}
	}
	rec(0)
	return best
}

func near(a, b float64) bool {
	return !math.IsNaN(a) && !math.IsNaN(b) && math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b))
}

func TestCalibrationLearnsPerDepth(t *testing.T) {
	var c Calibration
	depths := []int32{1, 2, 1}
	probs := []float64{0.9, 0.8, 0.05}
	// The drafter is right at depth 1 half the time and never at depth 2.
	accepted := []int{1, 0, 1, 0}
	wantErr := 0.0
	obs1, pred1, pred2 := 0.0, 0.0, 0.0
	for step, a := range accepted {
		f1, f2 := (obs1+1)/(pred1+1), 1/(pred2+1)
		predicted := math.Min(1, 0.9*f1) + math.Min(1, 0.8*f2) + math.Min(1, 0.05*f1)
		wantErr += math.Abs(predicted - float64(a))
		got := c.Calibrate(probs, depths)
		if want := []float64{math.Min(1, 0.9*f1), math.Min(1, 0.8*f2), math.Min(1, 0.05*f1)}; !slices.EqualFunc(got, want, near) {
			t.Fatalf("step %d: calibrated %v, want %v", step, got, want)
		}
		c.Observe(probs, depths, a)
		obs1 += float64(a)
		pred1 += 0.95
		pred2 += 0.8
	}
	r := c.Report()
	want := []DepthCalibration{{1, pred1, obs1}, {2, pred2, 0}}
	if r.Steps != 4 || !near(r.MeanAbsError, wantErr/4) || !slices.EqualFunc(r.Depths, want, func(a, b DepthCalibration) bool {
		return a.Depth == b.Depth && near(a.Predicted, b.Predicted) && near(a.Observed, b.Observed)
	}) {
		t.Errorf("report %+v, want depths %v and error %v", r, want, wantErr/4)
	}
	// Depth 2 was never accepted: its nodes are now predicted at 1/(3.2+1) of the drafter's belief.
	if got := c.Calibrate([]float64{0.8}, []int32{2}); !near(got[0], 0.8/4.2) {
		t.Errorf("calibrated depth-2 node %v, want %v", got[0], 0.8/4.2)
	}
	// An unseen depth keeps the drafter's probability.
	if got := c.Calibrate([]float64{0.3}, []int32{7}); got[0] != 0.3 {
		t.Errorf("unseen depth: %v", got[0])
	}
}

func TestBackoffSpacesOutDrafts(t *testing.T) {
	var b Backoff
	var trace strings.Builder
	// Drafts that never pay but the sixth.
	drafts := 0
	for range 60 {
		if !b.Draft() {
			trace.WriteByte('.')
			continue
		}
		trace.WriteByte('D')
		drafts++
		b.Drafted(drafts == 6)
	}
	// Skips of 1, 2, 4, 8, 16 after failed drafts; after the paying draft
	// it drafts again at once and backs off from 1 again.
	want := "D.D..D....D........D" + strings.Repeat(".", 16) + "D" + "D.D..D....D........D" + "..."
	if got := trace.String(); got != want {
		t.Errorf("drafts\n got %s\nwant %s", got, want)
	}
}

func TestPolicyModes(t *testing.T) {
	p := &Policy{}
	p.Cost.ObserveStep(1, 10*time.Millisecond)
	p.Cost.ObserveStep(16, 20*time.Millisecond)
	weak := [][]float64{{0.01, 0.001}}
	depths := [][]int32{{1, 2}}
	if got, keep := p.Allot(weak, depths, Rest{}); !slices.Equal(got, []int{1}) || keep[0] || p.Name() != "ddtree-auto" {
		t.Errorf("%s: %v %v, want one node and to stop drafting", p.Name(), got, keep)
	}
	p.Autoregressive = true
	if got, keep := p.Allot(weak, depths, Rest{}); !slices.Equal(got, []int{0}) || keep[0] || p.Name() != "adaptive" {
		t.Errorf("%s: %v %v, want none", p.Name(), got, keep)
	}
	p.Cost.ObserveDraft(time.Millisecond)
	strong := [][]float64{{0.9, 0.8, 0.7}}
	if got, keep := p.Allot(strong, [][]int32{{1, 2, 3}}, Rest{}); !slices.Equal(got, []int{3}) || !keep[0] {
		t.Errorf("confident drafts: %v %v, want all three nodes and to keep drafting", got, keep)
	}
	s := p.Snapshot()
	if s.Mode != "adaptive" || len(s.StepMs) != 2 || s.Calibration.Steps != 0 {
		t.Errorf("snapshot %+v", s)
	}
}
