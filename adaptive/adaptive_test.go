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

func TestCostModelEstimates(t *testing.T) {
	var c CostModel
	c.ObserveDraft(9*time.Millisecond, false) // catching up: the estimate until a steady draft
	if draft := c.Costs().DraftMs; draft != 9 {
		t.Errorf("after one catch-up draft of 9 ms the estimate is %v", draft)
	}
	c.ObserveStep(1, 9, 30*time.Millisecond)         // extra rows before any plain step: not attributable
	for _, ms := range []time.Duration{10, 30, 11} { // a burst of load in between
		c.ObserveStep(4, 4, ms*time.Millisecond)
	}
	for _, ms := range []time.Duration{6, 40, 5} {
		c.ObserveStep(1, 1, ms*time.Millisecond)
	}
	for ms := 17; ms >= 10; ms-- { // of 8, the 2nd smallest
		c.ObserveStep(2, 2, time.Duration(ms)*time.Millisecond)
	}
	// Rows beyond one per sequence: what they add to the plain step of as
	// many sequences (5 ms for one, 10.5 for four), alone and as a factor of
	// that beside other sequences.
	for _, ms := range []time.Duration{13, 14, 12} {
		c.ObserveStep(1, 9, ms*time.Millisecond) // 8 extra rows: 7 ms (of 8, 9, 7)
	}
	for _, ms := range []float64{24.5, 26.5, 25.5} {
		c.ObserveStep(4, 12, time.Duration(ms*float64(time.Millisecond))) // 8 extra rows beside 3 others: 14 ms, twice what they add alone
	}
	c.ObserveStep(1, 17, 40*time.Millisecond) // once: not a point yet
	c.ObserveStep(0, 1, time.Second)          // no sequences: ignored
	c.ObserveStep(2, 1, time.Second)          // fewer rows than sequences: ignored
	c.ObserveDraft(3*time.Millisecond, true)
	c.ObserveDraft(20*time.Millisecond, false)
	c.ObserveCommit(2 * time.Millisecond)
	got := c.Costs()
	// Lower quartiles (of 3, the smallest), made non-decreasing: the
	// 2-sequence step measured slower than the 4-sequence one is noise.
	plain, extra, factor := []Point{{1, 5}, {2, 10.5}, {4, 10.5}}, []Point{{8, 7}}, []Point{{4, 2}}
	samePoints := func(a, b []Point) bool {
		return slices.EqualFunc(a, b, func(a, b Point) bool { return a.Rows == b.Rows && near(a.Ms, b.Ms) })
	}
	if !samePoints(got.Plain, plain) || !samePoints(got.Extra, extra) || !samePoints(got.Factor, factor) || !near(got.DraftMs, 3) || !near(got.CommitMs, 2) {
		t.Errorf("costs %+v, want plain %v extra %v factor %v draft 3 commit 2", got, plain, extra, factor)
	}
	if !near(got.ProbeMs, 9) { // a probe catches up: the catch-up drafts' estimate (of 9 and 20 ms)
		t.Errorf("a probe's draft is estimated at %v ms, want 9", got.ProbeMs)
	}
	if s := c.String(); s != "plain [1:5ms 2:10.5ms 4:10.5ms] extra rows [8:7ms] factor [4:2x] draft 3ms commit 2ms" {
		t.Errorf("String() = %q", s)
	}
	if one := got.OneSequence(); !samePoints(one, []Point{{1, 5}, {9, 12}}) {
		t.Errorf("one sequence's curve %v", one)
	}
	// Only the last window measurements count: a lasting slowdown is followed.
	for range window {
		c.ObserveDraft(50*time.Millisecond, true)
	}
	if draft := c.Costs().DraftMs; draft != 50 {
		t.Errorf("after %d drafts of 50 ms the estimate is %v", window, draft)
	}
}

// TestCostsStepMs checks the step-time model: the plain step of the batch's
// sequences plus what its rows beyond them add.
func TestCostsStepMs(t *testing.T) {
	c := Costs{Plain: []Point{{1, 5}, {4, 8}}, Extra: []Point{{4, 2}, {8, 6}}, Factor: []Point{{4, 1.5}}}
	for _, tc := range []struct {
		seqs, rows int
		want       float64
	}{
		{1, 1, 5},
		{4, 4, 8},
		{2, 2, 6},     // between measured batches
		{8, 8, 12},    // beyond: along the last two
		{1, 3, 5 + 1}, // 2 extra rows: from none at none to 2 ms at 4
		{1, 5, 5 + 2},
		{4, 12, 8 + 1.5*6},      // beside three others: 1.5 times what 8 rows add alone
		{4, 20, 8 + 1.5*(6+8)},  // 16 extra rows: 1 ms a row beyond 8, alone
		{2, 6, 6 + (1+0.5/3)*2}, // between one sequence (1) and four (1.5)
		{8, 12, 12 + 1.5*2},     // beyond the measured factors: the last
		{4, 2, 8},               // fewer rows than sequences: the plain step
	} {
		if got := c.StepMs(tc.seqs, tc.rows); !near(got, tc.want) {
			t.Errorf("StepMs(%d sequences, %d rows) = %v, want %v", tc.seqs, tc.rows, got, tc.want)
		}
	}
	if got := (Costs{}).StepMs(4, 9); got != 0 {
		t.Errorf("nothing measured: %v", got)
	}
}

// TestBatchFactorWeighsRows: a verify of one node beside three plain
// sequences adds next to nothing to the step, so its factor is mostly
// noise (here 0); the factor is what many rows add, as the trees that
// matter have them.
func TestBatchFactorWeighsRows(t *testing.T) {
	var c CostModel
	for range 3 {
		c.ObserveStep(1, 1, time.Millisecond)
		c.ObserveStep(4, 4, 2*time.Millisecond)
	}
	for range 3 {
		c.ObserveStep(1, 2, 1100*time.Microsecond) // one extra row alone: 0.1 ms
		c.ObserveStep(1, 17, 5*time.Millisecond)   // 16: 4 ms
	}
	for i := range window {
		if i%4 == 3 {
			c.ObserveStep(4, 20, 10*time.Millisecond) // 16 extra rows beside three others: twice what they add alone
		} else {
			c.ObserveStep(4, 5, 2*time.Millisecond) // one: measured at the plain step
		}
	}
	if got := c.Costs().Factor; len(got) != 1 || got[0].Rows != 4 || !near(got[0].Ms, 2) {
		t.Errorf("batch factors %v, want 2 at 4 sequences", got)
	}
}

// TestPlainStepsRideOutBursts: a burst of slow steps (other programs'
// load) does not stand for the plain step, as it would if drafting
// stopped the plain steps right after it; a lasting slowdown does.
func TestPlainStepsRideOutBursts(t *testing.T) {
	var c CostModel
	observe := func(n int, d time.Duration) {
		for range n {
			c.ObserveStep(4, 4, d)
		}
	}
	observe(plainWindow, time.Millisecond)
	observe(30, 2*time.Millisecond)
	if got := c.Costs().StepMs(4, 4); !near(got, 1) {
		t.Errorf("after a burst of 30 slow steps, the plain step is estimated at %v ms, want 1", got)
	}
	observe(plainWindow, 2*time.Millisecond)
	if got := c.Costs().StepMs(4, 4); !near(got, 2) {
		t.Errorf("after %d slow steps, the plain step is estimated at %v ms, want 2", plainWindow, got)
	}
}

func TestCostModelStepOverhead(t *testing.T) {
	var c CostModel
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	c.ForwardStarts(at(0), false, 0) // a prompt chunk
	c.ForwardEnds(at(10), false, 0)
	c.ForwardStarts(at(15), true, 0) // the first decode step: no decode step before it
	c.ForwardEnds(at(20), true, 0)
	c.ForwardStarts(at(22), true, 0) // plain steps: 2 ms, then 1 ms of overhead
	c.ForwardEnds(at(30), true, 0)
	c.ForwardStarts(at(31), true, 0)
	c.ForwardEnds(at(35), true, 0)
	// Then a stretch of steps where two requests draft (2 ms) and verify:
	// of the 6 ms between forwards, 3 are neither drafting nor committing
	// (1 ms), and 1 of them a plain step has too: 1 ms of bookkeeping per
	// speculating request. It measures no plain step's overhead.
	now := 35
	for range 2 * window {
		c.ObserveCommit(time.Millisecond)
		c.ObserveDraft(2*time.Millisecond, false) // catching up or steady, drafting is not overhead
		c.ForwardStarts(at(now+6), true, 2)
		c.ForwardEnds(at(now+10), true, 2)
		now += 10
	}
	// After the last verify: committing (1 ms) and walking the trees.
	c.ObserveCommit(time.Millisecond)
	c.ForwardStarts(at(now+4), true, 0)
	c.ForwardEnds(at(now+10), false, 0) // a batch with a prompt chunk: the next gap is not a step's
	c.ForwardStarts(at(now+50), true, 0)
	if got := c.OverheadMs(); !near(got, 1) { // the lower of 1 and 2
		t.Errorf("step overhead %v ms, want 1", got)
	}
	if got := c.Costs().CommitMs; !near(got, 1+1) { // the commit and the bookkeeping, per speculating request
		t.Errorf("a speculating request's cost besides its draft: %v ms, want 2", got)
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

func TestDraftGains(t *testing.T) {
	strong, weak := []float64{0.9, 0.8, 0.7}, []float64{0.3}
	reqs := []Request{{Probs: strong}, {Probs: weak}, {Probs: strong}}
	n := []int{3, 1, 0}
	cost := linearCost(10, 1)
	// With the drafter at 2 ms: the strong request's 2.4 tokens pay for it,
	// the weak one's 0.3 do not; the third got no nodes for its draft.
	got := DraftGains(reqs, Rest{Rows: 1, Tokens: 1}, n, cost, 2)
	// Directly: the batch (4 tokens, 8 rows) commits 6.7 tokens in
	// 10 + 8 + 3·2 ms with every draft; without the strong request's, 4.3 in
	// 10 + 5 + 2·2, without the weak one's 6.4 in 10 + 7 + 2·2, without the
	// third's 6.7 in 10 + 8 + 2·2.
	want := []float64{6.7/4.3 - 24.0/19, 6.7/6.4 - 24.0/21, 1 - 24.0/22}
	if !slices.EqualFunc(got, want, near) {
		t.Fatalf("DraftGains = %v, want %v", got, want)
	}
	// A gain is positive exactly when the batch's rate is higher with the draft.
	for i, g := range got {
		if (g > 0) != (i == 0) {
			t.Errorf("request %d: gain %v, want it positive only for the strong request", i, g)
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
		keep := 1 - 1.0/memory // earlier steps' weight decays
		obs1 = obs1*keep + float64(a)
		pred1 = pred1*keep + 0.95
		pred2 = pred2*keep + 0.8
	}
	r := c.Report()
	want := []DepthCalibration{{1, pred1, obs1}, {2, pred2, 0}}
	if r.Steps != 4 || !near(r.MeanAbsError, wantErr/4) || !slices.EqualFunc(r.Depths, want, func(a, b DepthCalibration) bool {
		return a.Depth == b.Depth && near(a.Predicted, b.Predicted) && near(a.Observed, b.Observed)
	}) {
		t.Errorf("report %+v, want depths %v and error %v", r, want, wantErr/4)
	}
	// Depth 2 was never accepted: its nodes are now predicted at 1/(pred2+1) of the drafter's belief.
	if got := c.Calibrate([]float64{0.8}, []int32{2}); !near(got[0], 0.8/(pred2+1)) {
		t.Errorf("calibrated depth-2 node %v, want %v", got[0], 0.8/(pred2+1))
	}
	// An unseen depth keeps the drafter's probability.
	if got := c.Calibrate([]float64{0.3}, []int32{7}); got[0] != 0.3 {
		t.Errorf("unseen depth: %v", got[0])
	}
}

// TestCalibrationFollowsTheTraffic: a long stretch of text the drafter
// guesses badly (a chat), then text it guesses well (code): within a few
// memories the calibration trusts the drafter again, where lifetime sums
// would still predict a 0.8 node at 0.23.
func TestCalibrationFollowsTheTraffic(t *testing.T) {
	var c Calibration
	probs, depths := []float64{0.8}, []int32{1}
	for range 10 * memory {
		c.Observe(probs, depths, 0)
	}
	if got := c.Calibrate(probs, depths)[0]; got > 0.01 {
		t.Fatalf("after a drafter that is never right, a 0.8 node is predicted at %v", got)
	}
	for range 3 * memory {
		c.Observe(probs, depths, 1)
	}
	// observed/predicted after 3 memories of hits: (1−e⁻³)/(0.8) in the limit.
	want := math.Min(1, 0.8*(1-math.Exp(-3))/0.8)
	if got := c.Calibrate(probs, depths)[0]; math.Abs(got-want) > 0.02 {
		t.Errorf("after the drafter turned right, a 0.8 node is predicted at %v, want about %v", got, want)
	}
}

func TestProbeInterval(t *testing.T) {
	for _, c := range []struct {
		batch           int
		draftMs, stepMs float64
		want            int
	}{
		{1, 1.6, 1, 52},    // one request, a draft of 1.6 steps: 32 × 1.6 steps apart
		{4, 1, 1, 128},     // four requests probing share one step's time
		{0, 1, 1, 32},      // no batch counts as one request
		{1, 0, 1, 1},       // a free drafter probes every step
		{8, 10, 1, 1024},   // at most maxInterval
		{1, 1, 0, 1024},    // an unmeasured step
		{2, 0.5, 100, 1},   // a cheap drafter beside a slow step
		{3, 2, 6, 32},      // 3 · 2 / (6 / 32)
		{1, 0.125, 8.0, 1}, // under one step
	} {
		if got := ProbeInterval(c.batch, c.draftMs, c.stepMs); got != c.want {
			t.Errorf("ProbeInterval(%d, %v, %v) = %d, want %d", c.batch, c.draftMs, c.stepMs, got, c.want)
		}
	}
}

// drafts runs a request's schedule for steps steps on the engine's probe
// schedule s, gains(k) being the expected gain after its k-th draft, and
// traces them: D for a draft, . for a plain step.
func drafts(b Backoff, s *Probes, steps, interval int, gains func(k int) float64) string {
	var trace strings.Builder
	k := 0
	for range steps {
		if !s.draft(&b) {
			trace.WriteByte('.')
			continue
		}
		trace.WriteByte('D')
		b.record(Prediction{Probs: []float64{0.5}})
		s.judge(&b, gains(k), interval)
		k++
	}
	return trace.String()
}

func TestBackoffSchedule(t *testing.T) {
	losing := func(int) float64 { return -1 }
	eight := slices.Repeat([]Prediction{{Probs: []float64{0.5}}}, 8)
	for _, c := range []struct {
		name     string
		start    Backoff
		probes   Probes // the engine's schedule when the request starts
		interval int
		gains    func(k int) float64
		want     string
	}{
		{
			// It stops on the evidence of 8 drafts (a full window: the next
			// probe comes a quarter interval on), probes after 2, 4 and 8
			// steps (twice as long after each losing probe), and drafts every
			// step from the probe that pays.
			"stops, backs off, resumes", StartBackoff(nil, 1), Probes{}, 8,
			func(k int) float64 { return map[bool]float64{false: -1, true: 2}[k >= 10] },
			"DDDDDDDD" + ".." + "D" + "...." + "D" + strings.Repeat(".", 8) + strings.Repeat("D", 12),
		},
		{
			// Started with the engine's recent drafts as evidence, it stops at
			// once; that is not a relapse (no probe promised anything).
			"inherited evidence", StartBackoff(eight, 1), Probes{}, 8, losing,
			"D" + ".." + "D" + "...." + "D" + strings.Repeat(".", 8) + "D" + "...",
		},
		{
			// A draft expected to lose a little does not stop it.
			"near zero", StartBackoff(eight, 1), Probes{}, 8,
			func(int) float64 { return stopBelow / 2 },
			strings.Repeat("D", 40),
		},
		{
			// Started where the engine's drafts do not pay, it waits for the
			// engine's next probe, 5 steps on after two relapses; its probes
			// never pay, each wait doubles.
			"starts stopped", StartBackoff(eight, -0.2), Probes{steps: 100, due: 105, relapses: 2}, 8, losing,
			"....." + "D" + strings.Repeat(".", 16) + "D" + strings.Repeat(".", 32) + "D" + "..",
		},
		{
			// A probe expected to gain a little (under resumeAbove) is a
			// losing probe: one draft is weak evidence.
			"a probe that barely pays", StartBackoff(eight, -0.2), Probes{due: 4, relapses: 1}, 8,
			func(int) float64 { return resumeAbove / 2 },
			"...." + "D" + strings.Repeat(".", 8) + "D" + strings.Repeat(".", 16) + "D" + "..",
		},
		{
			// Resumed by a probe, it stops again on its next losing draft
			// (its judged drafts are many by now, the window is not
			// refilled): a relapse, the schedule backs off.
			"resumed, then losing", StartBackoff(nil, 1), Probes{}, 8,
			func(k int) float64 { return map[bool]float64{false: -1, true: 1}[k == 8] },
			"DDDDDDDD" + ".." + "DD" + "...." + "D" + strings.Repeat(".", 8) + "D" + "...",
		},
		{
			// Started stopped on the engine's drafts and resumed by a probe,
			// it stops on its next losing draft, as in "resumed, then losing".
			"started stopped, resumed, then losing", StartBackoff(eight, -0.2), Probes{}, 8,
			func(k int) float64 { return map[bool]float64{false: -1, true: 1}[k == 0] },
			"D" + "D" + "...." + "D" + strings.Repeat(".", 8) + "D" + "..",
		},
		{
			// Resumed after two relapses, it drafts a full window before it
			// stops: drafting paid, the next probe comes a quarter interval on.
			"resumed for a window", StartBackoff(eight, -0.2), Probes{relapses: 2}, 8,
			func(k int) float64 {
				switch {
				case k == 0:
					return 1
				case k <= 8:
					return 0
				}
				return -1
			},
			"D" + strings.Repeat("D", 8) + "D" + ".." + "D" + "...." + "D" + "..",
		},
		{
			"at most maxInterval", StartBackoff(nil, -1), Probes{due: 600, relapses: 2}, 600, losing,
			strings.Repeat(".", 600) + "D" + strings.Repeat(".", maxInterval) + "D" + strings.Repeat(".", maxInterval) + "D" + "....",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := drafts(c.start, &c.probes, len(c.want), c.interval, c.gains); got != c.want {
				t.Errorf("drafts\n got %s\nwant %s", got, c.want)
			}
		})
	}
}

// TestProbesAcrossRequests: the back-off outlives the request it began in,
// so short requests where drafting does not pay do not probe one each; and
// of stopped requests decoding side by side only one takes a due probe.
func TestProbesAcrossRequests(t *testing.T) {
	losing := func(int) float64 { return -1 }
	var s Probes
	first := drafts(StartBackoff(nil, 1), &s, 42, 8, losing)
	if want := "DDDDDDDD" + ".." + "D" + "...." + "D" + strings.Repeat(".", 8) + "D" + strings.Repeat(".", 16) + "D"; first != want {
		t.Fatalf("first request\n got %s\nwant %s", first, want)
	}
	// The next requests start stopped (the engine's drafts do not pay) and
	// go on with the back-off: the wait after four losing probes is 32
	// steps, the next 64.
	var later string
	for range 4 {
		later += drafts(StartBackoff(nil, -1), &s, 20, 8, losing) + "|"
	}
	if want := strings.Repeat(".", 20) + "|" + strings.Repeat(".", 12) + "D" + strings.Repeat(".", 7) + "|" + strings.Repeat(strings.Repeat(".", 20)+"|", 2); later != want {
		t.Errorf("later requests\n got %s\nwant %s", later, want)
	}
	// Two stopped requests side by side, a probe due after 3 steps: it goes
	// to one of them.
	s = Probes{due: 3}
	a, b := StartBackoff(nil, -1), StartBackoff(nil, -1)
	var trace string
	for range 4 {
		for _, r := range []*Backoff{&a, &b} {
			if s.draft(r) {
				trace += "D"
				r.record(Prediction{Probs: []float64{0.5}})
				s.judge(r, -1, 8)
			} else {
				trace += "."
			}
		}
		trace += " "
	}
	if want := ".. .D .. .. "; trace != want {
		t.Errorf("two stopped requests: %q, want %q", trace, want)
	}
	if a.probing || b.probing || s.relapses != 1 || s.due != 3+4 { // half the interval after the probe's step
		t.Errorf("after the probe: %+v, %+v, schedule %+v", a, b, s)
	}
	// However deep the back-off, a request probes after maxInterval of its
	// own steps without a draft.
	s = Probes{due: 10 * maxInterval, relapses: 12}
	if got, want := drafts(StartBackoff(nil, -1), &s, maxInterval+3, 8, losing), strings.Repeat(".", maxInterval)+"D.."; got != want {
		t.Errorf("a request waiting on a deep back-off: first probe after %d plain steps (-1: none), trace ends %q; want after %d, ending %q",
			strings.Index(got, "D"), got[len(got)-3:], maxInterval, want[len(want)-3:])
	}
	// A probe resumes a request deep in the back-off, which then drafts a
	// full window and ends without stopping (a short request): drafting
	// paid, so the relapses clear, and the next request that stops gets
	// its next probe a quarter interval on. With one draft fewer, the
	// promise is unproven and the back-off stays as it was.
	for _, c := range []struct {
		resumedDrafts, wantRelapses int
	}{{recentDrafts, 0}, {recentDrafts - 1, 5}} {
		s = Probes{relapses: 5}
		paying := func(int) float64 { return 1 }
		if got, want := drafts(StartBackoff(nil, -1), &s, 1+c.resumedDrafts, 8, paying), strings.Repeat("D", 1+c.resumedDrafts); got != want || s.relapses != c.wantRelapses {
			t.Errorf("resumed, then %d paying drafts to the request's end: %s, relapses %d; want %s, relapses %d", c.resumedDrafts, got, s.relapses, want, c.wantRelapses)
		}
	}
}

// TestPolicyBatchOfFour is concurrency 4 on a CPU: the drafter takes
// longer than a plain step of one sequence, and verify rows cost about as
// much beside three other sequences as alone. Drafts that pay for one
// request alone (a 2.5 ms step commits 5.4 tokens instead of 1 in 0.6 ms)
// do not pay beside three requests decoding plainly (8.4 tokens in 3.1 ms
// instead of 4 in 1.2 ms): a request starting in a batch of four does not
// draft, and four that drafted (started alone, say) all stop.
func TestPolicyBatchOfFour(t *testing.T) {
	p := &Policy{Autoregressive: true}
	observe := func(seqs, rows int, ms float64) {
		for range minSamples {
			p.Cost.ObserveStep(seqs, rows, time.Duration(ms*float64(time.Millisecond)))
		}
	}
	observe(1, 1, 0.6)
	observe(4, 4, 1.2)
	observe(1, 9, 1.5) // 8 verify rows add 0.9 ms
	p.Cost.ObserveDraft(time.Millisecond, true)
	draft := []float64{0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2}
	depths := []int32{1, 2, 3, 4, 5, 6, 7, 8}
	if gains := DraftGains([]Request{{Probs: draft}}, plainBatch(3), []int{8},
		func(rows int) float64 { return p.Cost.Costs().StepMs(4, rows) }, 1); !near(gains[0], 8.4/4-3.1/1.2) {
		t.Fatalf("beside three plain requests the draft gains %v, want %v", gains[0], 8.4/4-3.1/1.2)
	}
	alone := p.StartBackoff(1)
	for k := range 2 * minEvidence {
		if !p.Draft(&alone) {
			t.Fatalf("alone, the request stopped drafting after %d drafts", k)
		}
		if nodes := p.Allot([]Draft{{Probs: draft, Depths: depths}}, Rest{}, []*Backoff{&alone}); nodes[0] == 0 {
			t.Fatalf("alone, draft %d got no nodes", k)
		}
	}
	if b := p.StartBackoff(1); b.stopped {
		t.Error("where the engine's drafts pay, a request starting alone should draft at once")
	}
	if b := p.StartBackoff(4); !b.stopped {
		t.Error("a request starting in a batch of four drafts at once")
	}
	batch := make([]Backoff, 4)
	var backoffs []*Backoff
	for i := range batch {
		if batch[i] = p.StartBackoff(1); batch[i].stopped {
			t.Fatal("a request starting alone should draft at once")
		}
		backoffs = append(backoffs, &batch[i])
	}
	p.Allot(slices.Repeat([]Draft{{Probs: draft, Depths: depths}}, 4), Rest{}, backoffs)
	for i := range batch {
		if !batch[i].stopped {
			t.Errorf("request %d of the batch of four drafts on", i)
		}
	}
}

func TestExpectedGain(t *testing.T) {
	cost := linearCost(10, 1)
	good, bad := Prediction{Probs: []float64{0.9, 0.9, 0.8, 0.8}}, Prediction{Probs: []float64{0.05}}
	// Alone, a good draft's best allotment is its 4 nodes: 4.4 tokens in
	// 10 + 5 + 2 ms (a 2 ms draft) against 1 token in 11 ms.
	alone := 4.4 - 17.0/11
	// A bad draft is best verified with no node: 1 token in 11 + 2 ms.
	wasted := 1 - 13.0/11
	// The good draft made by a drafter (under a Choice) whose drafts take
	// 6 ms is judged at its own draft time, not at the policy's 2 ms.
	slow := &DrafterStats{}
	slow.ObserveDraft(6*time.Millisecond, true)
	slowGood := Prediction{Probs: good.Probs, Drafter: slow}
	for _, c := range []struct {
		name   string
		recent []Prediction
		rest   Rest
		want   float64
	}{
		{"none", nil, Rest{}, 0},
		{"one good draft", []Prediction{good}, Rest{}, alone},
		{"the mean of each draft's best", []Prediction{good, bad}, Rest{}, (alone + wasted) / 2},
		// Beside 40 other rows (40 tokens), only 2 nodes are worth their
		// rows, and the draft no longer pays: 42.8/41 − (10+43+2)/(10+41).
		{"in a big batch", []Prediction{good}, Rest{Rows: 40, Tokens: 40}, 42.8/41 - 55.0/51},
		{"each at its drafter's draft time", []Prediction{good, slowGood}, Rest{}, (alone + 4.4 - 21.0/11) / 2},
	} {
		if got := ExpectedGain(c.recent, c.rest, cost, 0, 2); !near(got, c.want) {
			t.Errorf("%s: ExpectedGain = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPolicyModes(t *testing.T) {
	p := &Policy{}
	for range minSamples {
		p.Cost.ObserveStep(1, 1, 10*time.Millisecond)
	}
	for range minSamples {
		p.Cost.ObserveStep(1, 16, 20*time.Millisecond)
	}
	p.Cost.ObserveDraft(5*time.Millisecond, true)
	if b := p.StartBackoff(1); b.stopped {
		t.Error("before any draft a request should draft")
	}
	weak := []Draft{{Probs: []float64{1e-4, 1e-5}, Depths: []int32{1, 2}}}
	if got := p.Allot(weak, Rest{}, nil); !slices.Equal(got, []int{1}) || p.Name() != "ddtree-auto" {
		t.Errorf("%s: %v, want one node", p.Name(), got)
	}
	p.Autoregressive = true
	// The drafter costs half a step and wins nothing: after minEvidence
	// drafts the request stops, probing a quarter interval (5 ms ·
	// 32 / 10 ms / 4 = 4 steps) later.
	b := p.StartBackoff(1)
	for k := range minEvidence {
		if !p.Draft(&b) {
			t.Fatalf("stopped after %d drafts", k)
		}
		if got := p.Allot(weak, Rest{}, []*Backoff{&b}); !slices.Equal(got, []int{0}) || p.Name() != "adaptive" {
			t.Fatalf("%s: %v, want no nodes", p.Name(), got)
		}
	}
	if wait := p.probes.due - p.probes.steps; !b.stopped || wait != 4 {
		t.Errorf("after %d losing drafts: stopped %v, the next probe in %d steps, want 4", minEvidence, b.stopped, wait)
	}
	// The engine's drafts do not pay: a new request starts autoregressive.
	if b := p.StartBackoff(1); !b.stopped {
		t.Error("a new request drafted at once where drafts do not pay")
	}
	for range 4 {
		if p.Draft(&b) {
			t.Fatal("the stopped request probed before the probe was due")
		}
	}
	if !p.Draft(&b) {
		t.Fatal("the stopped request did not probe when due")
	}
	strong := []Draft{{Probs: []float64{0.9, 0.8, 0.7}, Depths: []int32{1, 2, 3}}}
	if got := p.Allot(strong, Rest{}, []*Backoff{&b}); !slices.Equal(got, []int{3}) || b.stopped {
		t.Errorf("a confident probe: %v, stopped %v, want all three nodes and to draft on", got, b.stopped)
	}
	s := p.Snapshot()
	if s.Mode != "adaptive" || len(s.StepMs) != 2 || s.Calibration.Steps != 0 || s.DraftMs != 5 {
		t.Errorf("snapshot %+v", s)
	}
	if want := (ScheduleReport{Probes: 1, Resumes: 1, Stops: 1}); s.Schedule != want {
		t.Errorf("schedule %+v, want %+v (one stop, one probe that resumed drafting)", s.Schedule, want)
	}
}
