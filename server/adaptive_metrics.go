package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"ddflash/engine"
)

// adaptiveCollector exports the adaptive policy's cost curve and acceptance
// calibration (--spec adaptive, --budget auto) as they are at each scrape.
// It is unchecked (describes nothing up front): the series exist only under
// a policy, one per measured row count and per depth.
type adaptiveCollector struct {
	state func() (engine.SchedulerState, engine.SpecOptions, bool)
}

var (
	adaptiveStepDesc = prometheus.NewDesc("ddflash:adaptive_step_seconds",
		"Measured target forward time of one sequence by its rows (the adaptive policy's cost curve).", []string{"rows"}, nil)
	adaptiveBatchDesc = prometheus.NewDesc("ddflash:adaptive_batch_step_seconds",
		"Measured time of a plain decoding step (one row per sequence) by its sequences; verify rows add to it as to one sequence's step.", []string{"sequences"}, nil)
	adaptiveDraftDesc = prometheus.NewDesc("ddflash:adaptive_draft_seconds",
		"Measured drafter time per draft.", nil, nil)
	adaptiveCommitDesc = prometheus.NewDesc("ddflash:adaptive_commit_seconds",
		"Measured time a speculating request adds to a step besides its draft and rows: its commit (accepted path's GDN state and KV) and its tree's bookkeeping.", nil, nil)
	adaptivePredictedDesc = prometheus.NewDesc("ddflash:adaptive_predicted_accepted_total",
		"Drafter path probabilities summed over verified nodes of this depth: the predicted verify steps accepting at least depth tokens.", []string{"depth"}, nil)
	adaptiveObservedDesc = prometheus.NewDesc("ddflash:adaptive_observed_accepted_total",
		"Verify steps that accepted at least depth drafted tokens.", []string{"depth"}, nil)
	adaptiveErrorDesc = prometheus.NewDesc("ddflash:adaptive_calibration_error_tokens",
		"Mean absolute error of the calibrated prediction of accepted tokens per verify step, each made before its step.", nil, nil)
	adaptiveProbesDesc = prometheus.NewDesc("ddflash:adaptive_probes_total",
		"Probes: drafts made by requests that had stopped drafting, to see whether drafting pays by now (--spec adaptive).", nil, nil)
	adaptiveResumesDesc = prometheus.NewDesc("ddflash:adaptive_probe_resumes_total",
		"Probes that paid and resumed their request's drafting.", nil, nil)
	adaptiveStopsDesc = prometheus.NewDesc("ddflash:adaptive_drafting_stops_total",
		"Drafting requests that stopped drafting because their next draft was expected to lose.", nil, nil)
	adaptiveRelapsesDesc = prometheus.NewDesc("ddflash:adaptive_probe_relapses",
		"The probe schedule's back-off: losing probes and short-lived resumes since drafting last paid for a full window (each of the first 6 doubles the wait for the next probe).", nil, nil)
)

func (adaptiveCollector) Describe(chan<- *prometheus.Desc) {}

func (c adaptiveCollector) Collect(ch chan<- prometheus.Metric) {
	_, spec, ok := c.state()
	if !ok || spec.Policy == nil {
		return
	}
	s := spec.Policy.Snapshot()
	for _, p := range s.StepMs {
		ch <- prometheus.MustNewConstMetric(adaptiveStepDesc, prometheus.GaugeValue, p.Ms/1000, strconv.Itoa(p.Rows))
	}
	for _, p := range s.BatchMs {
		ch <- prometheus.MustNewConstMetric(adaptiveBatchDesc, prometheus.GaugeValue, p.Ms/1000, strconv.Itoa(p.Rows))
	}
	ch <- prometheus.MustNewConstMetric(adaptiveDraftDesc, prometheus.GaugeValue, s.DraftMs/1000)
	ch <- prometheus.MustNewConstMetric(adaptiveCommitDesc, prometheus.GaugeValue, s.CommitMs/1000)
	for _, d := range s.Calibration.Depths {
		depth := strconv.Itoa(d.Depth)
		ch <- prometheus.MustNewConstMetric(adaptivePredictedDesc, prometheus.CounterValue, d.Predicted, depth)
		ch <- prometheus.MustNewConstMetric(adaptiveObservedDesc, prometheus.CounterValue, d.Observed, depth)
	}
	ch <- prometheus.MustNewConstMetric(adaptiveErrorDesc, prometheus.GaugeValue, s.Calibration.MeanAbsError)
	if spec.Policy.Autoregressive { // only --spec adaptive stops and probes
		ch <- prometheus.MustNewConstMetric(adaptiveProbesDesc, prometheus.CounterValue, float64(s.Schedule.Probes))
		ch <- prometheus.MustNewConstMetric(adaptiveResumesDesc, prometheus.CounterValue, float64(s.Schedule.Resumes))
		ch <- prometheus.MustNewConstMetric(adaptiveStopsDesc, prometheus.CounterValue, float64(s.Schedule.Stops))
		ch <- prometheus.MustNewConstMetric(adaptiveRelapsesDesc, prometheus.GaugeValue, float64(s.Schedule.Relapses))
	}
}
