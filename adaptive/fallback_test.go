package adaptive

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// confidentTree is a 32-node draft tree of a drafter that is sure of its
// guesses (a chain at q^depth, with a runner-up beside each node), in
// DDTree's best-first order: its raw path probabilities and depths.
func confidentTree(q float64) ([]float64, []int32) {
	type node struct {
		prob  float64
		depth int32
	}
	var nodes []node
	chain := 1.0
	for d := int32(1); len(nodes) < 32; d++ {
		nodes = append(nodes, node{chain * 0.05, d}) // the runner-up
		chain *= q
		nodes = append(nodes, node{chain, d})
	}
	slices.SortStableFunc(nodes, func(a, b node) int {
		switch {
		case a.prob > b.prob:
			return -1
		case a.prob < b.prob:
			return 1
		}
		return 0
	})
	probs, depths := make([]float64, 32), make([]int32, 32)
	for i, n := range nodes[:32] {
		probs[i], depths[i] = n.prob, n.depth
	}
	return probs, depths
}

// TestFallsBackWhereDraftsNeverPay plays make run's sweep (12 requests of
// 96 tokens, one after another) on a pair whose drafter is never right,
// from unsure to confident, with the costs of a random pair of the demo
// pair's shapes (docs/demo-pair.md): a draft costs 1.25 decode steps, a
// probe's catch-up draft 2, verifying 16 rows 3 steps. The policy must
// fall back to plain decoding: drafted steps at most 3 % of all (the
// first request's window of 8 drafts and the probes: 14-16 of 1,152).
func TestFallsBackWhereDraftsNeverPay(t *testing.T) {
	ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
	for _, q := range []float64{0.3, 0.7, 0.95} {
		t.Run(fmt.Sprintf("q=%v", q), func(t *testing.T) {
			p := &Policy{Autoregressive: true}
			for range plainWindow { // costs this run's bookkeeping cannot move
				p.Cost.ObserveStep(1, 1, ms(4))
				p.Cost.ObserveStep(1, 9, ms(7))
				p.Cost.ObserveStep(1, 17, ms(12))
				p.Cost.ObserveStep(1, 33, ms(22))
				p.Cost.ObserveDraft(ms(5), true)
				p.Cost.ObserveDraft(ms(8), false)
			}
			probs, depths := confidentTree(q)
			const requests, tokens = 12, 96
			drafted, steps := 0, 0
			for range requests {
				var b Backoff
				for k := range tokens {
					steps++
					if k == 0 { // the first decoding step is plain; the schedule starts there
						b = p.StartBackoff(1)
						continue
					}
					if !p.Draft(&b) {
						continue
					}
					drafted++
					n := p.Allot([]Draft{{Probs: probs, Depths: depths}}, Rest{}, []*Backoff{&b})[0]
					if n > 0 {
						p.Calibration.Observe(probs[:n], depths[:n], 0)
					}
				}
			}
			if share := float64(drafted) / float64(steps); share > 0.03 {
				t.Errorf("%d drafts in %d steps (%.1f %%): want at most 3 %%; calibration %+v", drafted, steps, 100*share, p.Calibration.Report())
			}
		})
	}
}
