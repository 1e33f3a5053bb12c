package bench

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Row is one run of one configuration, as the reports show it.
type Row struct {
	Source string // the results directory
	Config string
	Knobs  Knobs
	Run    Run
	// Speedup is over the same directory's autoregressive run with the same
	// TP degree, weights, workload, length and concurrency; nil without one.
	Speedup *float64
	// VsCheckpoint, for a run on other than the checkpoint's own weights
	// (Knobs.Weights), is its decode speedup (TPOT ratio, as Speedup) over
	// the same directory's run of the same configuration on the
	// checkpoint's weights; nil otherwise.
	VsCheckpoint *float64
	// Lossless says whether a greedy speculative run's outputs equal that
	// baseline's; nil when not compared (sampling, no baseline, the baseline).
	Lossless *bool
}

// Results is what report reads from one or more results directories.
type Results struct {
	Rows     []Row
	Failures []string // "dir/config: run: error"
	Skipped  []string // files that failed their checks
	CPU, GPU string   // of the first record, for captions
}

// LoadResults reads every valid result file in dirs. Damaged files are
// skipped and named in Skipped; failure files are listed in Failures.
func LoadResults(dirs []string) (*Results, error) {
	res := &Results{}
	for _, dir := range dirs {
		st := Store{Dir: dir}
		results, failures, err := st.Entries()
		if err != nil {
			return nil, err
		}
		var rows []Row
		var records []*Record
		for _, c := range results {
			r, err := st.ReadRecord(c)
			if err != nil {
				res.Skipped = append(res.Skipped, err.Error())
				continue
			}
			res.CPU = cmp.Or(res.CPU, r.Setup.Host.CPU)
			if gpus := r.Setup.Host.GPUs; len(gpus) > 0 {
				res.GPU = cmp.Or(res.GPU, gpus[0].Name)
			}
			records = append(records, r)
			for _, run := range r.Runs {
				rows = append(rows, Row{Source: dir, Config: c, Knobs: r.Setup.Knobs, Run: run})
			}
		}
		for _, c := range failures {
			var f Failure
			if err := readSealed(st.failurePath(c), &f); err != nil {
				res.Skipped = append(res.Skipped, fmt.Sprintf("%s: %v", st.failurePath(c), err))
				continue
			}
			for _, rf := range f.Failures {
				res.Failures = append(res.Failures, fmt.Sprintf("%s/%s %s: %s", dir, c, rf.RunKey, rf.Error))
			}
		}
		for i := range rows {
			rows[i].Lossless = lossless(records, rows[i].Knobs, &rows[i].Run)
			rows[i].Speedup = rows[i].Run.Metrics.Speedup
			k := rows[i].Knobs
			for _, b := range rows {
				if b.Knobs.TP != k.TP || b.Run.RunKey != rows[i].Run.RunKey {
					continue
				}
				if b.Knobs.Spec == "auto" && b.Knobs.Weights == k.Weights && !strings.HasSuffix(b.Knobs.Mode, NoCacheSuffix) {
					rows[i].Speedup = speedup(&b.Run.Metrics, &rows[i].Run.Metrics)
				}
				if k.Weights != "" && b.Knobs.Weights == "" && b.Knobs.Mode == k.Mode {
					rows[i].VsCheckpoint = speedup(&b.Run.Metrics, &rows[i].Run.Metrics)
				}
			}
		}
		res.Rows = append(res.Rows, rows...)
	}
	slices.SortStableFunc(res.Rows, compareRows)
	return res, nil
}

// modeRank orders modes: the baseline, MTP chains by steps, the DFlash
// chains, trees by budget, then adaptive.
func modeRank(k Knobs) (int, int) {
	switch {
	case k.Spec == "auto":
		return 0, 0
	case k.Drafter == MTPDrafter:
		return 1, k.Budget
	case k.Spec == "linear":
		return 2, 0
	case k.Spec == "adaptive":
		return 4, 0
	}
	return 3, k.Budget
}

func compareRows(a, b Row) int {
	ak, ab := modeRank(a.Knobs)
	bk, bb := modeRank(b.Knobs)
	return cmp.Or(
		cmp.Compare(a.Source, b.Source), cmp.Compare(a.Run.Workload, b.Run.Workload),
		cmp.Compare(a.Run.MaxTokens, b.Run.MaxTokens), cmp.Compare(a.Run.Concurrency, b.Run.Concurrency),
		cmp.Compare(a.Knobs.TP, b.Knobs.TP), cmp.Compare(ak, bk), cmp.Compare(ab, bb),
		cmp.Compare(a.Knobs.Weights, b.Knobs.Weights),
	)
}

// prefixTable lists the runs of multi-turn workloads: the share of prompt
// tokens the prefix cache supplied, the TTFT of turns after the first (which
// resend the conversation so far) and its ratio to the same mode's run
// without the cache (mode NoCacheSuffix) from the same directory. Only
// results that used a prefix cache (a hit, or a NoCacheSuffix mode) have it.
func (r *Results) prefixTable(w io.Writer, multi bool) {
	if !slices.ContainsFunc(r.Rows, func(row Row) bool {
		h := row.Run.Metrics.PrefixCacheHitRate
		return (h != nil && *h > 0) || strings.HasSuffix(row.Knobs.Mode, NoCacheSuffix)
	}) {
		return
	}
	head := "| TP | mode | workload | max tokens | conc. | prefix hit rate | TTFT ms | TTFT turn ≥ 2 ms | turn ≥ 2 TTFT vs " + NoCacheSuffix + " |"
	if multi {
		head = "| source " + head
	}
	header := false
	for _, row := range r.Rows {
		m := &row.Run.Metrics
		if m.LaterTurnsTTFT.N == 0 {
			continue
		}
		if !header {
			fmt.Fprint(w, "\n**Prefix cache (multi-turn workloads):**\n\n")
			fmt.Fprintln(w, head)
			fmt.Fprintln(w, strings.Repeat("|---", strings.Count(head, "|")-1)+"|")
			header = true
		}
		ratio := "-"
		for _, o := range r.Rows {
			if o.Source == row.Source && o.Knobs.TP == row.Knobs.TP && o.Run.RunKey == row.Run.RunKey &&
				o.Knobs.Mode == row.Knobs.Mode+NoCacheSuffix && o.Run.Metrics.LaterTurnsTTFT.Mean > 0 {
				ratio = fmt.Sprintf("%.2fx", m.LaterTurnsTTFT.Mean/o.Run.Metrics.LaterTurnsTTFT.Mean)
			}
		}
		hit := optPercent(m.PrefixCacheHitRate, 0)
		if multi {
			fmt.Fprintf(w, "| %s ", filepath.Base(row.Source))
		}
		fmt.Fprintf(w, "| %d | %s | %s | %d | %d | %s | %.1f | %.1f | %s |\n", row.Knobs.TP, row.Knobs.Mode, row.Run.Workload,
			row.Run.MaxTokens, row.Run.Concurrency, hit, m.TTFT.Mean, m.LaterTurnsTTFT.Mean, ratio)
	}
}

// optPercent is a share as a percentage with so many decimals ("-" when unmeasured).
func optPercent(v *float64, decimals int) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.*f%%", decimals, 100**v)
}

func optFloat(v *float64, format string) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf(format, *v)
}

// Markdown writes the results table, failures and skipped files below it.
func (r *Results) Markdown(w io.Writer) {
	multi, weights := r.multiSource(), r.otherWeights()
	head := "| TP | mode | workload | max tokens | conc. | tok/s | per-user tok/s | τ | accept | speedup | TTFT ms | TPOT ms | slots busy |"
	if weights {
		head = strings.Replace(head, "| mode |", "| weights | mode |", 1) + " vs checkpoint |"
	}
	if multi {
		head = "| source " + head
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, strings.Repeat("|---", strings.Count(head, "|")-1)+"|")
	for _, row := range r.Rows {
		m := &row.Run.Metrics
		if multi {
			fmt.Fprintf(w, "| %s ", filepath.Base(row.Source))
		}
		rate := optPercent(m.AcceptanceRate, 0)
		speed := optFloat(row.Speedup, "%.2fx")
		if row.lossy() {
			speed = "LOSSY"
		}
		fmt.Fprintf(w, "| %d | ", row.Knobs.TP)
		if weights {
			fmt.Fprintf(w, "%s | ", row.weights())
		}
		fmt.Fprintf(w, "%s | %s | %d | %d | %.1f | %.1f | %s | %s | %s | %.1f | %.2f | %s |",
			row.Knobs.Mode, row.Run.Workload, row.Run.MaxTokens, row.Run.Concurrency,
			m.OutputThroughput, m.PerUserTokS, optFloat(m.AcceptanceLength, "%.2f"), rate,
			speed, m.TTFT.Mean, m.TPOT.Mean, optPercent(m.SlotUse, 1)) // a tail of a few percent is what it shows
		if weights {
			fmt.Fprintf(w, " %s |", optFloat(row.VsCheckpoint, "%.2fx"))
		}
		fmt.Fprintln(w)
	}
	r.prefixTable(w, multi)
	r.adaptiveTable(w, multi)
	if lossy := slices.DeleteFunc(slices.Clone(r.Rows), func(row Row) bool { return !row.lossy() }); len(lossy) > 0 {
		fmt.Fprintln(w, "\n**Lossy runs (greedy outputs differ from autoregressive decoding's; their speed is not a result):**")
		for _, row := range lossy {
			fmt.Fprintf(w, "- %s/%s %s\n", row.Source, row.Config, row.Run.RunKey)
		}
	}
	if len(r.Failures) > 0 {
		fmt.Fprintln(w, "\n**Failed runs (not results):**")
		for _, f := range r.Failures {
			fmt.Fprintf(w, "- %s\n", f)
		}
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintln(w, "\n**Skipped files (run `ddflash bench verify`):**")
		for _, s := range r.Skipped {
			fmt.Fprintf(w, "- %s\n", s)
		}
	}
}

func (row *Row) lossy() bool { return row.Lossless != nil && !*row.Lossless }

// AdaptiveCell is one adaptive run beside the fastest fixed mode of its
// cell: the same directory, TP degree, weights, workload, length and
// concurrency.
type AdaptiveCell struct {
	Adaptive, Best Row
	Ratio          float64 // adaptive's throughput over the best's
}

// AdaptiveVsBest pairs every adaptive run (spec adaptive) with the fastest
// run of a fixed mode (autoregressive included) in its cell, by output
// throughput; lossy runs are no result and take no part. The adaptive
// sweeps' criterion is each cell's ratio (≥ 0.95 is the project's bar).
func (r *Results) AdaptiveVsBest() []AdaptiveCell {
	sameCell := func(a, b Row) bool {
		return a.Source == b.Source && a.Knobs.TP == b.Knobs.TP && a.Knobs.Weights == b.Knobs.Weights && a.Run.RunKey == b.Run.RunKey
	}
	var cells []AdaptiveCell
	for _, a := range r.Rows {
		if a.Knobs.Spec != "adaptive" || a.lossy() {
			continue
		}
		var best *Row
		for i, b := range r.Rows {
			if b.Knobs.Spec == "adaptive" || b.lossy() || !sameCell(a, b) {
				continue
			}
			if best == nil || b.Run.Metrics.OutputThroughput > best.Run.Metrics.OutputThroughput {
				best = &r.Rows[i]
			}
		}
		if best != nil && best.Run.Metrics.OutputThroughput > 0 {
			cells = append(cells, AdaptiveCell{Adaptive: a, Best: *best, Ratio: a.Run.Metrics.OutputThroughput / best.Run.Metrics.OutputThroughput})
		}
	}
	return cells
}

// adaptiveTable lists AdaptiveVsBest, and the lowest ratio of each
// adaptive mode over its cells.
func (r *Results) adaptiveTable(w io.Writer, multi bool) {
	cells := r.AdaptiveVsBest()
	if len(cells) == 0 {
		return
	}
	head := "| TP | adaptive mode | workload | max tokens | conc. | tok/s | best fixed mode | its tok/s | ratio |"
	if multi {
		head = "| source " + head
	}
	fmt.Fprint(w, "\n**Adaptive against the best fixed mode of each cell:**\n\n")
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, strings.Repeat("|---", strings.Count(head, "|")-1)+"|")
	lowest := map[string]float64{}
	var modes []string
	for _, c := range cells {
		if multi {
			fmt.Fprintf(w, "| %s ", filepath.Base(c.Adaptive.Source))
		}
		a, b := &c.Adaptive, &c.Best
		fmt.Fprintf(w, "| %d | %s | %s | %d | %d | %.1f | %s | %.1f | %.3f |\n", a.Knobs.TP, a.Knobs.Mode, a.Run.Workload,
			a.Run.MaxTokens, a.Run.Concurrency, a.Run.Metrics.OutputThroughput, b.Knobs.Mode, b.Run.Metrics.OutputThroughput, c.Ratio)
		if low, ok := lowest[a.Knobs.Mode]; !ok || c.Ratio < low {
			if !ok {
				modes = append(modes, a.Knobs.Mode)
			}
			lowest[a.Knobs.Mode] = c.Ratio
		}
	}
	fmt.Fprintln(w)
	for _, m := range modes {
		fmt.Fprintf(w, "- %s: lowest ratio %.3f\n", m, lowest[m])
	}
}

// weights names the row's weights as --weights does.
func (row *Row) weights() string { return cmp.Or(row.Knobs.Weights, "checkpoint") }

// otherWeights reports whether some row ran on other than the checkpoint's weights.
func (r *Results) otherWeights() bool {
	return slices.ContainsFunc(r.Rows, func(row Row) bool { return row.Knobs.Weights != "" })
}

func (r *Results) multiSource() bool {
	return slices.ContainsFunc(r.Rows, func(row Row) bool { return row.Source != r.Rows[0].Source })
}

// CSV writes one line per row with every summary metric.
func (r *Results) CSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 8, 64) }
	opt := func(v *float64) string {
		if v == nil {
			return ""
		}
		return f(*v)
	}
	cw.Write([]string{"source", "config", "tp", "weights", "mode", "spec", "budget", "workload", "max_tokens", "concurrency",
		"enable_thinking", "requests", "output_tokens", "output_throughput", "per_user_tok_s",
		"ttft_ms_mean", "ttft_ms_p99", "tpot_ms_mean", "tpot_ms_p99", "itl_chunk_ms_mean", "itl_token_ms_mean",
		"slot_use", "acceptance_length", "acceptance_rate", "speedup", "vs_checkpoint", "lossless"})
	for _, row := range r.Rows {
		m, k := &row.Run.Metrics, row.Knobs
		cw.Write([]string{row.Source, row.Config, strconv.Itoa(k.TP), row.weights(), k.Mode, k.Spec, strconv.Itoa(k.Budget),
			row.Run.Workload, strconv.Itoa(row.Run.MaxTokens), strconv.Itoa(row.Run.Concurrency),
			strconv.FormatBool(row.Run.EnableThinking), strconv.Itoa(row.Run.Completed), strconv.Itoa(row.Run.OutputTokens),
			f(m.OutputThroughput), f(m.PerUserTokS), f(m.TTFT.Mean), f(m.TTFT.P99), f(m.TPOT.Mean), f(m.TPOT.P99),
			f(m.ITLChunk.Mean), f(m.ITLToken.Mean), opt(m.SlotUse), opt(m.AcceptanceLength), opt(m.AcceptanceRate), opt(row.Speedup), opt(row.VsCheckpoint), optBool(row.Lossless)})
	}
	cw.Flush()
	return cw.Error()
}

func optBool(v *bool) string {
	if v == nil {
		return ""
	}
	return strconv.FormatBool(*v)
}

// Benchstat writes every measured pass in the Go benchmark format, one
// sub-benchmark key per axis, so `benchstat -col /mode FILE` compares modes.
func (r *Results) Benchstat(w io.Writer) {
	fmt.Fprintln(w, "pkg: ddflash/bench")
	if r.CPU != "" {
		fmt.Fprintf(w, "cpu: %s\n", r.CPU)
	}
	multi := r.multiSource()
	for _, row := range r.Rows {
		name := fmt.Sprintf("BenchmarkDecode/workload=%s/max_tokens=%d/concurrency=%d/tp=%d/mode=%s",
			row.Run.Workload, row.Run.MaxTokens, row.Run.Concurrency, row.Knobs.TP, row.Knobs.Mode)
		if row.Knobs.Weights != "" {
			name += "/weights=" + row.Knobs.Weights
		}
		if multi {
			name += "/source=" + strings.ReplaceAll(filepath.Base(row.Source), " ", "_")
		}
		for _, s := range row.Run.Samples {
			fmt.Fprintf(w, "%s 1 %.4g tok/s %.4g tpot-ms %.4g ttft-ms", name, s.OutputThroughput, s.TPOTMs, s.TTFTMs)
			if s.AcceptanceLength != nil {
				fmt.Fprintf(w, " %.4g tau", *s.AcceptanceLength)
			}
			fmt.Fprintln(w)
		}
	}
}
