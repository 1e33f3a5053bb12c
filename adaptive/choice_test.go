package adaptive

import (
	"testing"
	"time"
)

// TestChoiceChoosesTheDrafterExpectedToPay: every drafter drafts once
// first; then a request drafts with the drafter whose calibrated drafts
// speed decoding up more, whether they lose on acceptance (a drafter as
// confident as the other whose proposals the target always rejected), on
// draft cost (the same acceptance, ten times the draft time) or on both
// (a token more per draft at nine times the draft time), whichever
// position it has; and a drafter not chosen drafts again after
// ReprobeSteps drafts, and is retired for the request once it lost that
// trial too.
func TestChoiceChoosesTheDrafterExpectedToPay(t *testing.T) {
	stepMs := func(rows int) float64 { return 10 + 0.5*float64(rows) }
	probs, depths := []float64{0.9, 0.8, 0.7, 0.6}, []int32{1, 2, 3, 4}
	type drafter struct {
		accepted int     // tokens the target accepted of each calibration draft
		draftMs  float64 // each draft's time
	}
	for _, c := range []struct {
		name     string
		drafters []drafter
		want     int
	}{
		{"rejected second", []drafter{{4, 1}, {0, 1}}, 0},
		{"rejected first", []drafter{{0, 1}, {4, 1}}, 1},
		{"slow second", []drafter{{4, 1}, {4, 10}}, 0},
		{"slow first", []drafter{{4, 10}, {4, 1}}, 1},
		// One token fewer at a ninth of the draft time: it gains fewer
		// batch steps per draft (2.75 against 2.94) but each in a step half
		// as long, so decoding is faster (3.2× against 2.4×).
		{"cheaper first", []drafter{{3, 1}, {4, 9}}, 0},
		{"cheaper second", []drafter{{4, 9}, {3, 1}}, 1},
	} {
		choice := NewChoice(len(c.drafters))
		for i, d := range c.drafters {
			for range 50 {
				choice.Drafters[i].Calibration.Observe(probs, depths, d.accepted)
				choice.Drafters[i].ObserveDraft(time.Duration(d.draftMs*float64(time.Millisecond)), true)
			}
		}
		s := choice.NewState()
		for i := range c.drafters {
			if got := choice.Choose(s, 1, stepMs, 0.1); got != i {
				t.Fatalf("%s: first draft %d by drafter %d, want each in order", c.name, i, got)
			}
			s.Drafted(i, probs, depths)
		}
		// The other drafter last drafted at most one draft ago.
		steps := 0
		for ; steps <= ReprobeSteps; steps++ {
			got := choice.Choose(s, 1, stepMs, 0.1)
			s.Drafted(got, probs, depths)
			if got != c.want {
				break
			}
		}
		if steps < ReprobeSteps-1 || steps > ReprobeSteps {
			t.Errorf("%s: drafter %d chose for %d drafts, then the other; want about ReprobeSteps (%d)", c.name, c.want, steps, ReprobeSteps)
		}
		// The other lost its second trial: it is retired for the request
		// and never drafts for it again.
		other := 1 - c.want
		if s.Retired(other) {
			t.Errorf("%s: drafter %d retired before its second trial was judged", c.name, other)
		}
		for k := range 3 * ReprobeSteps {
			if got := choice.Choose(s, 1, stepMs, 0.1); got != c.want {
				t.Fatalf("%s: draft %d after the second trial by drafter %d, want only %d", c.name, k, got, c.want)
			}
			s.Drafted(c.want, probs, depths)
		}
		if !s.Retired(other) || s.Retired(c.want) {
			t.Errorf("%s: retired %v and %v, want only drafter %d", c.name, s.Retired(0), s.Retired(1), other)
		}
	}
}

// TestChoiceWeighsOtherRequestsDrafts: a drafter whose drafts paid for
// earlier requests is not ruled out for a new one by one unlucky draft for
// it (the cheaper drafter here, as a DFlash block beside an MTP chain);
// once a full window of its drafts for the request lost, the other drafts.
func TestChoiceWeighsOtherRequestsDrafts(t *testing.T) {
	stepMs := func(rows int) float64 { return 10 + 0.5*float64(rows) }
	sure, unsure := []float64{0.9, 0.8, 0.7, 0.6}, []float64{0.05, 0.01, 0.005, 0.001}
	depths := []int32{1, 2, 3, 4}
	choice := NewChoice(2)
	for i, draftMs := range []float64{1, 5} { // drafter 0 is the cheaper
		for range 50 {
			choice.Drafters[i].Calibration.Observe(sure, depths, 4)
			choice.Drafters[i].Calibration.Observe(unsure, depths, 0)
			choice.Drafters[i].ObserveDraft(time.Duration(draftMs*float64(time.Millisecond)), true)
		}
	}
	earlier := choice.NewState()
	for range 8 {
		earlier.Drafted(0, sure, depths)
		earlier.Drafted(1, sure, depths)
	}
	s := choice.NewState()
	s.Drafted(0, unsure, depths) // its first draft for s was unlucky
	s.Drafted(1, sure, depths)
	if got := choice.Choose(s, 1, stepMs, 0.1); got != 0 {
		t.Errorf("after one unlucky draft for a new request, drafter %d chosen; want 0, whose drafts paid for the earlier request", got)
	}
	for range recentDrafts - 1 {
		s.Drafted(0, unsure, depths)
	}
	if got := choice.Choose(s, 1, stepMs, 0.1); got != 1 {
		t.Errorf("after a window of unlucky drafts for the request, drafter %d chosen; want 1", got)
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

// TestChoiceJudgesATrialByItsOwnDraft: a drafter on trial is judged by the
// trial's draft alone, not by its older drafts for the request (which made
// it lose, and which the chosen drafter's fresh drafts outweigh) nor by
// other requests': one whose opening draft for the request was poor but
// whose trial draft is sure is chosen after the trial over one whose
// drafts are middling.
func TestChoiceJudgesATrialByItsOwnDraft(t *testing.T) {
	stepMs := func(rows int) float64 { return 10 + 0.5*float64(rows) }
	sure, middling, unsure := []float64{0.9, 0.8, 0.7, 0.6}, []float64{0.5, 0.4, 0.3, 0.2}, []float64{0.05, 0.01, 0.005, 0.001}
	depths := []int32{1, 2, 3, 4}
	choice := NewChoice(2)
	for i := range choice.Drafters {
		for range 50 {
			choice.Drafters[i].Calibration.Observe(sure, depths, 4)
			choice.Drafters[i].Calibration.Observe(middling, depths, 3)
			choice.Drafters[i].Calibration.Observe(unsure, depths, 0)
			choice.Drafters[i].ObserveDraft(time.Millisecond, true)
		}
	}
	earlier := choice.NewState() // drafter 1's drafts for another request were poor
	for range recentDrafts {
		earlier.Drafted(1, unsure, depths)
	}
	s := choice.NewState()
	for i, probs := range [][]float64{middling, unsure} { // the openings
		if got := choice.Choose(s, 1, stepMs, 0.1); got != i {
			t.Fatalf("opening draft %d by drafter %d, want each in order", i, got)
		}
		s.Drafted(i, probs, depths)
	}
	trial := 0
	for ; trial <= ReprobeSteps; trial++ {
		got := choice.Choose(s, 1, stepMs, 0.1)
		if got == 1 {
			break
		}
		s.Drafted(0, middling, depths)
	}
	if trial > ReprobeSteps {
		t.Fatalf("drafter 1 not tried again within %d drafts", ReprobeSteps)
	}
	s.Drafted(1, sure, depths)
	if got := choice.Choose(s, 1, stepMs, 0.1); got != 1 {
		t.Errorf("after drafter 1's sure trial draft, drafter %d chosen; want 1, judged by that draft and not its older ones", got)
	}
}
