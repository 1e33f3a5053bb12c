package adaptive

import (
	"testing"
	"time"
)

// TestChoicePicksTheFasterDrafter: requests go round the drafters until
// each has finished minSpeeds of them; then each goes to the drafter of
// the highest mean speed over its latest speedWindow requests, except
// every ExploreEvery-th, which goes to the drafters in turn; requests too
// short to say anything do not count; and a drafter that becomes faster
// takes the requests over once its window says so.
func TestChoicePicksTheFasterDrafter(t *testing.T) {
	for _, fast := range []int{0, 1, 2} {
		c := NewChoice(3)
		speed := func(i int) float64 {
			if i == fast {
				return 150
			}
			return 120 + 10*float64(i)
		}
		finish := func(i int) { c.Finished(i, 96, time.Duration(float64(96)/speed(i)*float64(time.Second))) }
		for k := range 3 * minSpeeds {
			if got := c.Pick(); got != k%3 {
				t.Fatalf("fast %d: request %d went to drafter %d before every drafter was measured, want %d", fast, k, got, k%3)
			}
			c.Finished(k%3, minSpeedTokens-1, time.Millisecond) // too short: not counted
			finish(k % 3)
		}
		picks := make([]int, 3)
		for k := 3 * minSpeeds; k < 3*minSpeeds+5*ExploreEvery; k++ {
			got := c.Pick()
			want := fast
			if k%ExploreEvery == 0 {
				want = k / ExploreEvery % 3
			}
			if got != want {
				t.Fatalf("fast %d: request %d went to drafter %d, want %d", fast, k, got, want)
			}
			picks[got]++
			finish(got)
		}
		t.Logf("fast %d: requests per drafter %v", fast, picks)
	}
	// Drafter 1 becomes faster than drafter 0: once its mean passes 0's,
	// it is picked.
	c := NewChoice(2)
	for range minSpeeds {
		c.Pick()
		c.Finished(0, 100, time.Second)
		c.Pick()
		c.Finished(1, 90, time.Second)
	}
	for range speedWindow {
		c.Finished(1, 110, time.Second)
	}
	for range ExploreEvery {
		k := c.requests
		if got := c.Pick(); got != 1 && k%ExploreEvery != 0 {
			t.Fatalf("request %d: drafter 1 (110 tok/s over its window) lost to drafter 0 (100)", k)
		}
	}
}

// TestChoiceBreaksSpeedTiesByDraftCost: drafters whose speeds are within
// speedTie of the fastest's are a tie, which the drafter of the cheapest
// drafts wins (at equal cost, the faster; a drafter whose cost is not
// measured wins no tie); a cheaper drafter slower by more than speedTie
// loses.
func TestChoiceBreaksSpeedTiesByDraftCost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		speeds []float64 // tokens per second, per drafter
		costs  []float64 // ms per draft, 0: not measured
		want   int
	}{
		{"tie, second cheaper", []float64{102, 100}, []float64{6, 2}, 1},
		{"tie, first cheaper", []float64{100, 102}, []float64{2, 6}, 0},
		{"tie, just inside", []float64{100, 97.5}, []float64{6, 2}, 1},
		{"no tie, just outside", []float64{100, 96.5}, []float64{6, 2}, 0},
		{"cheaper but slower", []float64{100, 95}, []float64{6, 2}, 0},
		{"tie, equal cost: the faster", []float64{100, 101}, []float64{3, 3}, 1},
		{"tie, cost not measured", []float64{102, 100}, []float64{6, 0}, 0},
		{"three, two tied", []float64{100, 120, 118}, []float64{1, 6, 4}, 2},
	} {
		c := NewChoice(len(tc.speeds))
		for i, ms := range tc.costs {
			if ms > 0 {
				c.Drafters[i].ObserveDraft(time.Duration(ms*float64(time.Millisecond)), true)
			}
		}
		for i, v := range tc.speeds {
			for range minSpeeds {
				c.Finished(i, 96, time.Duration(96/v*float64(time.Second)))
			}
		}
		c.requests = 1 // not an exploring request
		if got := c.Pick(); got != tc.want {
			t.Errorf("%s: picked drafter %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestPolicyJudgesADraftByItsDrafter: under a Choice, the policy allots a
// draft by its own drafter's calibration and judges whether drafting pays
// at its own drafter's draft time, not at the policy's, which mixes every
// drafter's: a draft whose drafter is always rejected gets no node where
// the policy's calibration would verify it, and a drafter that takes
// longer than a step stops drafting where the same drafts at the policy's
// draft time go on.
func TestPolicyJudgesADraftByItsDrafter(t *testing.T) {
	p := &Policy{Autoregressive: true}
	for range minSamples {
		p.Cost.ObserveStep(1, 1, 10*time.Millisecond)
	}
	for range minSamples {
		p.Cost.ObserveStep(1, 16, 20*time.Millisecond)
	}
	p.Cost.ObserveDraft(time.Millisecond, true)
	probs, depths := []float64{0.9, 0.8, 0.7}, []int32{1, 2, 3}
	choice := NewChoice(2)
	rejected, slow := &choice.Drafters[0], &choice.Drafters[1]
	for range 50 {
		rejected.Calibration.Observe(probs, depths, 0)
		rejected.ObserveDraft(time.Millisecond, true)
		slow.Calibration.Observe(probs, depths, 3)
		slow.ObserveDraft(30*time.Millisecond, true)
	}
	if got := p.Allot([]Draft{{Probs: probs, Depths: depths}}, Rest{}, nil); got[0] != 3 {
		t.Fatalf("by the policy's calibration the draft gets %d nodes, want 3", got[0])
	}
	if got := p.Allot([]Draft{{Probs: probs, Depths: depths, Drafter: rejected}}, Rest{}, nil); got[0] != 0 {
		t.Errorf("the draft of a drafter the target always rejects gets %d nodes, want 0", got[0])
	}
	for _, c := range []struct {
		name    string
		drafter *DrafterStats
		stops   bool
	}{{"at the policy's draft time", nil, false}, {"at its drafter's", slow, true}} {
		b := StartBackoff(nil, 1)
		for range minEvidence {
			if got := p.Allot([]Draft{{Probs: probs, Depths: depths, Drafter: c.drafter}}, Rest{}, []*Backoff{&b}); got[0] != 3 {
				t.Fatalf("%s: the draft gets %d nodes, want 3", c.name, got[0])
			}
		}
		if b.stopped != c.stops {
			t.Errorf("%s: after a window of drafts stopped %v, want %v", c.name, b.stopped, c.stops)
		}
	}
}
