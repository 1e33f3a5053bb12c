package bench

import (
	"bytes"
	"encoding/csv"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func f64(v float64) *float64 { return &v }

// sweepRows is a budget sweep of one run: auto, linear and two trees.
func sweepRows() *Results {
	key := RunKey{Workload: "fibonacci", MaxTokens: 256, Concurrency: 1}
	row := func(mode, spec string, budget int, tput, tpot float64, tau *float64) Row {
		return Row{Source: "bench_results", Config: "tp1-" + mode,
			Knobs: Knobs{TP: 1, Mode: mode, Spec: spec, Budget: budget},
			Run: Run{RunKey: key, Completed: 2, OutputTokens: 512, Metrics: Metrics{
				OutputThroughput: tput, PerUserTokS: 1000 / tpot, TPOT: Dist{N: 2, Mean: tpot}, SlotUse: f64(0.987), AcceptanceLength: tau,
			}, Samples: []Sample{{OutputThroughput: tput - 1, TPOTMs: tpot, AcceptanceLength: tau}, {OutputThroughput: tput + 1, TPOTMs: tpot, AcceptanceLength: tau}}}}
	}
	rows := []Row{
		row("auto", "auto", 0, 100, 10, nil),
		row("linear", "linear", 15, 150, 6, f64(3.1)),
		row("b8", "ddtree", 8, 170, 5, f64(3.6)),
		row("b16", "ddtree", 16, 160, 5.5, f64(3.9)),
	}
	for i := range rows {
		rows[i].Speedup = speedup(&rows[0].Run.Metrics, &rows[i].Run.Metrics)
	}
	return &Results{Rows: rows, CPU: "Test CPU"}
}

func TestMarkdownTable(t *testing.T) {
	var b bytes.Buffer
	sweepRows().Markdown(&b)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 6 {
		t.Fatalf("want a header, a rule and 4 rows:\n%s", b.String())
	}
	want := "| 1 | b8 | fibonacci | 256 | 1 | 170.0 | 200.0 | 3.60 | - | 2.00x | 0.0 | 5.00 | 98.7% |"
	if lines[4] != want {
		t.Errorf("b8 row\n got %s\nwant %s", lines[4], want)
	}
	if strings.Count(lines[0], "|") != strings.Count(lines[1], "|") {
		t.Errorf("rule does not match the header:\n%s\n%s", lines[0], lines[1])
	}
}

func TestCSV(t *testing.T) {
	var b bytes.Buffer
	if err := sweepRows().CSV(&b); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&b).ReadAll()
	if err != nil || len(recs) != 5 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	if v, _ := strconv.ParseFloat(recs[3][col["output_throughput"]], 64); v != 170 || recs[3][col["mode"]] != "b8" || recs[3][col["speedup"]] != "2" || recs[3][col["slot_use"]] != "0.987" {
		t.Errorf("b8 record %v", recs[3])
	}
	if recs[1][col["acceptance_length"]] != "" {
		t.Errorf("the baseline has an acceptance length: %v", recs[1])
	}
}

// TestBenchstatFormat checks the output against the Go benchmark format
// (golang.org/design/14313-benchmark-format) that benchstat parses.
func TestBenchstatFormat(t *testing.T) {
	var b bytes.Buffer
	sweepRows().Benchstat(&b)
	config := regexp.MustCompile(`^[a-z][^\s:]*: .+$`)
	bench := regexp.MustCompile(`^Benchmark[^a-z\s]\S*\s+\d+(\s+\S+\s+\S+)+$`)
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if config.MatchString(line) {
			continue
		}
		if !bench.MatchString(line) {
			t.Fatalf("not a benchmark line: %q", line)
		}
		f := strings.Fields(line)
		for i := 2; i < len(f); i += 2 {
			if _, err := strconv.ParseFloat(f[i], 64); err != nil {
				t.Errorf("value %q in %q", f[i], line)
			}
		}
		n++
	}
	if n != 8 || !strings.Contains(b.String(), "/tp=1/mode=b8 1 169 tok/s 5 tpot-ms 0 ttft-ms 3.6 tau") {
		t.Errorf("%d benchmark lines (want one per pass, 8):\n%s", n, b.String())
	}
}

func TestSVGPlot(t *testing.T) {
	var b bytes.Buffer
	if err := sweepRows().SVG(&b); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	var points string
	dec := xml.NewDecoder(&b)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
			if se.Name.Local == "polyline" {
				points = se.Attr[0].Value
			}
		}
	}
	if counts["svg"] != 1 || counts["polyline"] != 1 || counts["circle"] != 3 {
		t.Errorf("elements %v: want one line through 3 points (auto, b8, b16)", counts)
	}
	var xs, ys []float64
	for _, p := range strings.Fields(points) {
		x, y, _ := strings.Cut(p, ",")
		xv, _ := strconv.ParseFloat(x, 64)
		yv, _ := strconv.ParseFloat(y, 64)
		xs, ys = append(xs, xv), append(ys, yv)
	}
	// Budgets 0, 8, 16 at equal spacing; 170 tok/s (b8) plotted highest.
	if len(xs) != 3 || !(xs[0] < xs[1] && xs[1] < xs[2]) || !near(xs[1]-xs[0], xs[2]-xs[1]) || !(ys[1] < ys[2] && ys[2] < ys[0]) {
		t.Errorf("polyline points %q", points)
	}
}

func TestLoadResultsAcrossDirectories(t *testing.T) {
	base := t.TempDir()
	good, broken := filepath.Join(base, "vllm-b15"), filepath.Join(base, "sglang-b8")
	if _, err := serverSweep(t, &fakeServer{tokenIDs: true}, chatPlan(t, "b15", 1, 6, 1, 1), good); err != nil {
		t.Fatal(err)
	}
	if _, err := serverSweep(t, &fakeServer{fail: "status"}, chatPlan(t, "b8", 1, 6, 1, 1), broken); err == nil {
		t.Fatal("the broken server's sweep succeeded")
	}
	res, err := LoadResults([]string{good, broken})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 1 || len(res.Failures) != 1 || res.Rows[0].Speedup != nil || len(res.Skipped) != 0 {
		t.Fatalf("rows %+v, failures %v, skipped %v", res.Rows, res.Failures, res.Skipped)
	}
	var b bytes.Buffer
	res.Markdown(&b)
	if !strings.Contains(b.String(), "Failed runs") || !strings.Contains(b.String(), "sglang-b8/tp1-b8 chat-6tok-c1") {
		t.Errorf("markdown does not show the failure:\n%s", b.String())
	}
	rec := filepath.Join(good, "tp1-b15.json")
	mustWrite(t, rec, mustRead(t, rec)[:50])
	if res, err = LoadResults([]string{good}); err != nil || len(res.Rows) != 0 || len(res.Skipped) != 1 {
		t.Errorf("a truncated record: rows %d, skipped %v, %v", len(res.Rows), res.Skipped, err)
	}
}

func TestReportFlagsLossyRuns(t *testing.T) {
	dir := lossySweep(t, 0)
	res, err := LoadResults([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	lossless := map[string]string{}
	for _, row := range res.Rows {
		lossless[row.Config+" "+row.Run.RunKey.String()] = optBool(row.Lossless)
	}
	want := map[string]string{
		"tp1-auto chat-6tok-c1": "", "tp1-auto chat-6tok-c2": "",
		"tp1-linear chat-6tok-c1": "true", "tp1-linear chat-6tok-c2": "true",
		"tp1-b15 chat-6tok-c1": "true", "tp1-b15 chat-6tok-c2": "false",
	}
	if !maps.Equal(lossless, want) {
		t.Errorf("lossless per run %v, want %v", lossless, want)
	}
	var md bytes.Buffer
	res.Markdown(&md)
	if strings.Count(md.String(), "LOSSY") != 1 || !strings.Contains(md.String(), "**Lossy runs") ||
		!strings.Contains(md.String(), "/tp1-b15 chat-6tok-c2") {
		t.Errorf("markdown does not flag exactly the lossy run:\n%s", md.String())
	}
	var c bytes.Buffer
	if err := res.CSV(&c); err != nil || !strings.Contains(c.String(), ",lossless\n") || strings.Count(c.String(), ",false\n") != 1 {
		t.Errorf("csv (%v):\n%s", err, c.String())
	}
}

// TestAdaptiveVsBest pairs each adaptive run with its cell's fastest fixed
// mode, leaving out lossy runs and other cells.
func TestAdaptiveVsBest(t *testing.T) {
	res := sweepRows() // auto 100, linear 150, b8 170, b16 160 tok/s at concurrency 1
	run := func(mode, spec string, conc int, tput float64, lossless bool) Row {
		return Row{Source: "bench_results", Config: "tp1-" + mode, Knobs: Knobs{TP: 1, Mode: mode, Spec: spec},
			Run:      Run{RunKey: RunKey{Workload: "fibonacci", MaxTokens: 256, Concurrency: conc}, Metrics: Metrics{OutputThroughput: tput}},
			Lossless: &lossless}
	}
	res.Rows = append(res.Rows,
		run("adaptive", "adaptive", 1, 161.5, true),
		run("adaptive-mtp", "adaptive", 1, 180, true),
		run("auto", "auto", 4, 300, true),
		run("b8", "ddtree", 4, 200, true),
		run("b4", "ddtree", 4, 400, false), // lossy: no result
		run("adaptive", "adaptive", 4, 291, true),
	)
	var got []string
	for _, c := range res.AdaptiveVsBest() {
		got = append(got, fmt.Sprintf("%s c%d: %s %.3f", c.Adaptive.Knobs.Mode, c.Adaptive.Run.Concurrency, c.Best.Knobs.Mode, c.Ratio))
	}
	want := []string{"adaptive c1: b8 0.950", "adaptive-mtp c1: b8 1.059", "adaptive c4: auto 0.970"}
	if !slices.Equal(got, want) {
		t.Errorf("AdaptiveVsBest:\n got %q\nwant %q", got, want)
	}
	var b bytes.Buffer
	res.Markdown(&b)
	for _, line := range []string{
		"| 1 | adaptive | fibonacci | 256 | 4 | 291.0 | auto | 300.0 | 0.970 |",
		"- adaptive: lowest ratio 0.950",
		"- adaptive-mtp: lowest ratio 1.059",
	} {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("report lacks %q:\n%s", line, b.String())
		}
	}
}
