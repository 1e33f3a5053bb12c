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
