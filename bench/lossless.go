package bench

import "fmt"

// Speculative decoding must be lossless: at temperature 0 every mode's
// outputs are the target's argmax chain, token for token the autoregressive
// baseline's. A greedy speculative run whose outputs hash differs from the
// baseline's run of the same workload, length and concurrency is a bug, and
// its speed is not a result.

// greedySpec reports whether a configuration's outputs must equal the
// autoregressive baseline's.
func greedySpec(k Knobs) bool { return k.Spec != "auto" && k.Temperature == 0 }

// baselineOf finds the autoregressive run that a run's outputs are compared
// with: the same TP degree, weights and run key.
func baselineOf(records []*Record, k Knobs, key RunKey) *Run {
	for _, r := range records {
		if b := r.Setup.Knobs; b.Spec != "auto" || b.TP != k.TP || b.Weights != k.Weights {
			continue
		}
		for i := range r.Runs {
			if r.Runs[i].RunKey == key {
				return &r.Runs[i]
			}
		}
	}
	return nil
}

// lossless compares a run of a configuration with its baseline: nil when
// there is nothing to compare (sampled outputs, the baseline itself, or no
// baseline run), else whether the outputs match.
func lossless(records []*Record, k Knobs, run *Run) *bool {
	if !greedySpec(k) {
		return nil
	}
	base := baselineOf(records, k, run.RunKey)
	if base == nil {
		return nil
	}
	same := base.OutputsSHA256 == run.OutputsSHA256
	return &same
}

// lossyRuns lists the runs of r whose outputs differ from the baseline's.
func lossyRuns(records []*Record, r *Record) []string {
	var out []string
	for i := range r.Runs {
		if same := lossless(records, r.Setup.Knobs, &r.Runs[i]); same != nil && !*same {
			out = append(out, r.Runs[i].RunKey.String())
		}
	}
	return out
}

func lossyProblem(k Knobs, runs []string) string {
	base := Config{TP: k.TP, Weights: k.Weights, Mode: Mode{Name: "auto"}}
	return fmt.Sprintf("LOSSY: greedy outputs differ from %s on %v (speculative decoding must reproduce autoregressive output token for token)", base.Name(), runs)
}
