package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"ddflash/adaptive"
	"ddflash/engine"
)

// scrape reads /metrics with Prometheus' own parser. Samples are keyed
// name{label="value",...} without model_name; histograms give _count and _sum.
func scrape(t *testing.T, h *harness) map[string]float64 {
	t.Helper()
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				switch {
				case l.GetName() == "model_name" && l.GetValue() != testModel:
					t.Errorf("%s: model_name %q", name, l.GetValue())
				case l.GetName() != "model_name":
					labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
			}
			sort.Strings(labels)
			key := name
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			case m.Histogram != nil:
				out[key+"_count"] = float64(m.Histogram.GetSampleCount())
				out[key+"_sum"] = m.Histogram.GetSampleSum()
			}
		}
	}
	return out
}

// TestSpecMetricsMatchTheEngine runs requests one at a time through a DDTree
// server, so each sees exactly the forwards it would see alone, and checks
// every counter against the SpecStats the engine reports for the same
// requests run directly on an identical engine.
func TestSpecMetricsMatchTheEngine(t *testing.T) {
	spec := engine.SpecOptions{Mode: engine.SpecTree, Budget: 6}
	h := serveTiny(t, harnessOptions{spec: spec, sched: engine.SchedulerOptions{MaxRunning: 1}})
	direct := newEngine(t, spec, 1)
	_, _, tok := modelDirs(t)
	rng := rand.New(rand.NewPCG(31, 32))

	before := scrape(t, h)
	if before["ddflash:spec_decode_tree_budget"] != 6 {
		t.Errorf("tree budget gauge %v, want 6", before["ddflash:spec_decode_tree_budget"])
	}
	want := map[string]float64{}
	perPos := make([]float64, direct.Drafter.BlockSize()-1)
	finished := map[string]float64{}
	for range 6 {
		prompt := randomPrompt(rng, 1, 15)
		ids := tok.Encode(prompt)
		maxTokens := 1 + rng.IntN(40)
		res, err := direct.Generate(context.Background(), engine.Request{Prompt: ids, MaxTokens: maxTokens})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.client.Completions.New(context.Background(), completionParams(prompt, maxTokens)); err != nil {
			t.Fatal(err)
		}
		st := res.Stats.SpecStats
		want["vllm:spec_decode_num_drafts_total"] += float64(st.VerifySteps)
		want["vllm:spec_decode_num_draft_tokens_total"] += float64(st.DraftTokens)
		want["vllm:spec_decode_num_accepted_tokens_total"] += float64(st.AcceptedTokens)
		want["vllm:prompt_tokens_total"] += float64(len(ids))
		want["vllm:generation_tokens_total"] += float64(len(res.Tokens))
		for i, n := range st.AcceptedPerPosition {
			perPos[i] += float64(n)
		}
		finished[res.FinishReason]++
	}
	// Every verify step commits its accepted drafts plus the bonus token.
	want["ddflash:spec_decode_acceptance_length_count"] = want["vllm:spec_decode_num_drafts_total"]
	want["ddflash:spec_decode_acceptance_length_sum"] = want["vllm:spec_decode_num_drafts_total"] + want["vllm:spec_decode_num_accepted_tokens_total"]
	for i, n := range perPos {
		want[fmt.Sprintf("vllm:spec_decode_num_accepted_tokens_per_pos_total{position=%q}", fmt.Sprint(i))] = n
	}
	for reason, n := range finished {
		want[fmt.Sprintf("vllm:request_success_total{finished_reason=%q}", reason)] = n
	}
	want["vllm:e2e_request_latency_seconds_count"] = 6
	want["vllm:time_to_first_token_seconds_count"] = 6

	after := scrape(t, h)
	for key, v := range want {
		if got := after[key] - before[key]; got != v {
			t.Errorf("%s rose by %v, want %v", key, got, v)
		}
	}
	if want["vllm:spec_decode_num_drafts_total"] == 0 {
		t.Fatal("no verify steps: the test exercised nothing")
	}
	for _, g := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "ddflash:state_slot_usage_perc"} {
		if v, ok := after[g]; !ok || v != 0 {
			t.Errorf("idle gauge %s = %v (present %v), want 0", g, v, ok)
		}
	}
}

// TestAdaptiveMetricsShowThePolicy serves with --budget auto (which always
// speculates, so calibration has steps to count) and with --spec adaptive,
// and checks that /metrics shows the policy's cost curve, calibration and
// (adaptive only: the other never stops drafting) probe schedule as the
// policy itself reports them.
func TestAdaptiveMetricsShowThePolicy(t *testing.T) {
	for _, autoregressive := range []bool{false, true} {
		policy := &adaptive.Policy{Autoregressive: autoregressive}
		t.Run(policy.Name(), func(t *testing.T) { checkAdaptiveMetrics(t, policy) })
	}
}

func checkAdaptiveMetrics(t *testing.T, policy *adaptive.Policy) {
	if policy.Autoregressive {
		// Drafts that cost 100 ms never pay: the first request stops
		// drafting after its window of drafts, so the schedule has a stop
		// to show.
		for range 64 {
			policy.Cost.ObserveDraft(100*time.Millisecond, true)
		}
	}
	h := serveTiny(t, harnessOptions{spec: engine.SpecOptions{Mode: engine.SpecTree, Budget: 6, Policy: policy}})
	if got := scrape(t, h); len(got) == 0 || got["ddflash:adaptive_draft_seconds"] != policy.Snapshot().DraftMs/1000 {
		t.Fatalf("before any request: draft time %v", got["ddflash:adaptive_draft_seconds"])
	}
	rng := rand.New(rand.NewPCG(33, 34))
	for range 3 {
		if _, err := h.client.Completions.New(context.Background(), completionParams(randomPrompt(rng, 1, 15), 20)); err != nil {
			t.Fatal(err)
		}
	}
	got := scrape(t, h)
	s := policy.Snapshot()
	want := map[string]float64{
		"ddflash:adaptive_draft_seconds":            s.DraftMs / 1000,
		"ddflash:adaptive_commit_seconds":           s.CommitMs / 1000,
		"ddflash:adaptive_calibration_error_tokens": s.Calibration.MeanAbsError,
	}
	schedule := map[string]float64{
		"ddflash:adaptive_probes_total":         float64(s.Schedule.Probes),
		"ddflash:adaptive_probe_resumes_total":  float64(s.Schedule.Resumes),
		"ddflash:adaptive_drafting_stops_total": float64(s.Schedule.Stops),
		"ddflash:adaptive_probe_relapses":       float64(s.Schedule.Relapses),
	}
	for key, v := range schedule {
		if policy.Autoregressive {
			want[key] = v
		} else if _, ok := got[key]; ok {
			t.Errorf("%s exported for a policy that never stops drafting", key)
		}
	}
	for _, p := range s.StepMs {
		want[fmt.Sprintf("ddflash:adaptive_step_seconds{rows=%q}", fmt.Sprint(p.Rows))] = p.Ms / 1000
	}
	for _, p := range s.BatchMs {
		want[fmt.Sprintf("ddflash:adaptive_batch_step_seconds{sequences=%q}", fmt.Sprint(p.Rows))] = p.Ms / 1000
	}
	for _, d := range s.Calibration.Depths {
		want[fmt.Sprintf("ddflash:adaptive_predicted_accepted_total{depth=%q}", fmt.Sprint(d.Depth))] = d.Predicted
		want[fmt.Sprintf("ddflash:adaptive_observed_accepted_total{depth=%q}", fmt.Sprint(d.Depth))] = d.Observed
	}
	measured := len(s.StepMs) >= 2 && len(s.BatchMs) > 0 && s.DraftMs > 0 && s.CommitMs > 0
	if policy.Autoregressive {
		measured = measured && s.Schedule.Stops > 0 // its drafts verify no node: nothing to calibrate
	} else {
		measured = measured && s.Calibration.Steps > 0
	}
	if !measured {
		t.Fatalf("the policy measured nothing: %+v", s)
	}
	for key, v := range want {
		if g, ok := got[key]; !ok || g != v {
			t.Errorf("%s = %v (present %v), the policy says %v", key, g, ok, v)
		}
	}
}
