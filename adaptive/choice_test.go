package adaptive

import (
	"testing"
	"time"
)

// TestChoiceChoosesTheDrafterExpectedToPay: every drafter drafts once
// first; then a request drafts with the drafter whose calibrated drafts
// gain more per step time, whether they lose on acceptance (a drafter as
// confident as the other whose proposals the target always rejected) or
// on draft cost (the same acceptance, ten times the draft time), whichever
// position it has; and a drafter not chosen drafts again after
// ReprobeSteps drafts.
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
	}
}
