package bench

import (
	"fmt"
	"io"
	"io/fs"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Finding is verify's verdict on one configuration.
type Finding struct {
	Config  string
	Runs    int  // valid runs in its result file
	Planned int  // runs it should hold
	OK      bool // complete and valid
	Damaged bool // the result file is unreadable or fails its checks: delete it
	// Lossy marks greedy speculative outputs that differ from the
	// autoregressive baseline's: a bug to fix, not a run to repeat.
	Lossy   bool
	Problem string
}

// Verification is verify's answer for a results directory.
type Verification struct {
	Dir      string
	Findings []Finding
	Temps    []string // leftovers of interrupted writes
	Argv     []string // the sweep's command line, from sweep.json
}

// OK reports whether every configuration is complete and valid.
func (v *Verification) OK() bool {
	for _, f := range v.Findings {
		if !f.OK {
			return false
		}
	}
	return len(v.Findings) > 0
}

// Verify re-checks every file of a results directory: schema, checksum,
// completeness against the plan, validity of every run, the trace files
// the runs point at, and that greedy speculative outputs equal the
// autoregressive baseline's.
func Verify(dir string) (*Verification, error) {
	st := Store{Dir: dir}
	v := &Verification{Dir: dir}
	results, failures, err := st.Entries()
	if err != nil {
		return nil, err
	}
	byConfig := map[string]int{} // index into v.Findings, which grows
	finding := func(config string) *Finding {
		i, ok := byConfig[config]
		if !ok {
			i = len(v.Findings)
			byConfig[config] = i
			v.Findings = append(v.Findings, Finding{Config: config})
		}
		return &v.Findings[i]
	}
	man, err := st.ReadManifest()
	switch {
	case err != nil:
		f := finding(sweepFile)
		f.Problem, f.Damaged = err.Error(), true
	case man != nil:
		v.Argv = man.Argv
		for _, c := range man.Configs {
			finding(c).Planned = len(man.Plan)
		}
	}
	var valid []*Record
	for _, c := range results {
		f := finding(c)
		r, planned, err := checkRecord(st, c)
		f.Planned = max(f.Planned, planned)
		if err != nil {
			f.Damaged, f.Problem = true, err.Error()
			continue
		}
		f.Runs = len(r.Runs)
		valid = append(valid, r)
	}
	for _, r := range valid {
		if lossy := lossyRuns(valid, r); len(lossy) > 0 {
			f := finding(r.Config)
			f.Lossy, f.Problem = true, lossyProblem(r.Setup.Knobs, lossy)
		}
	}
	for _, c := range failures {
		f := finding(c)
		var fl Failure
		err := readSealed(st.failurePath(c), &fl)
		switch {
		case err != nil:
			f.Problem = join(f.Problem, fmt.Sprintf("%s: %v", filepath.Base(st.failurePath(c)), err))
		case len(fl.Failures) > 0:
			rf := fl.Failures[0]
			f.Problem = join(f.Problem, fmt.Sprintf("failed (%d run(s)); %s: %s", len(fl.Failures), rf.RunKey, rf.Error))
		}
	}
	for i := range v.Findings {
		f := &v.Findings[i]
		switch {
		case f.Problem != "":
		case !slices.Contains(results, f.Config) && f.Config != sweepFile:
			f.Problem = "no result file"
		case f.Runs < f.Planned:
			f.Problem = fmt.Sprintf("incomplete: %d of %d runs", f.Runs, f.Planned)
		}
		f.OK = f.Problem == ""
	}
	slices.SortFunc(v.Findings, func(a, b Finding) int { return strings.Compare(a.Config, b.Config) })
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), tempPrefix) {
			v.Temps = append(v.Temps, path)
		}
		return err
	})
	return v, err
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// checkRecord validates a result file and returns it and its plan size.
func checkRecord(st Store, config string) (rec *Record, planned int, err error) {
	var r Record
	if err := readSealed(st.resultPath(config), &r); err != nil {
		return nil, 0, err
	}
	planned = len(r.Setup.Plan)
	if r.Config != config {
		return nil, planned, fmt.Errorf("the file says it holds %q", r.Config)
	}
	seen := map[RunKey]bool{}
	for i := range r.Runs {
		run := &r.Runs[i]
		if !slices.Contains(r.Setup.Plan, run.RunKey) || seen[run.RunKey] {
			return nil, planned, fmt.Errorf("run %s is not in the plan or appears twice", run.RunKey)
		}
		seen[run.RunKey] = true
		if err := checkRun(st, run, r.Setup.Knobs.Repeats); err != nil {
			return nil, planned, fmt.Errorf("run %s: %w", run.RunKey, err)
		}
	}
	if r.Complete != (len(r.Runs) == planned) {
		return nil, planned, fmt.Errorf("marked complete=%v with %d of %d runs", r.Complete, len(r.Runs), planned)
	}
	return &r, planned, nil
}

// checkRun re-applies the validity rules a run passed when it was saved.
func checkRun(st Store, run *Run, repeats int) error {
	tput := run.Metrics.OutputThroughput
	switch {
	case run.Requested < 1 || run.Completed != run.Requested || run.Failed != 0:
		return fmt.Errorf("%d of %d requests completed, %d failed", run.Completed, run.Requested, run.Failed)
	case !(tput > 0) || math.IsInf(tput, 0) || run.OutputTokens < 1:
		return fmt.Errorf("output throughput %v tok/s over %d tokens", tput, run.OutputTokens)
	case len(run.Samples) != repeats:
		return fmt.Errorf("%d samples for %d repeats", len(run.Samples), repeats)
	case run.Trace == nil:
		return fmt.Errorf("no trace file")
	}
	reqs, err := st.ReadTrace(run.Trace)
	if err != nil {
		return err
	}
	if len(reqs) != run.Completed {
		return fmt.Errorf("the trace holds %d requests, the run %d", len(reqs), run.Completed)
	}
	return nil
}

// Print writes the verdicts and, when something must be rerun, how.
func (v *Verification) Print(w io.Writer) {
	var rerun, damaged []string
	for _, f := range v.Findings {
		if f.OK {
			fmt.Fprintf(w, "ok     %-16s %d/%d runs\n", f.Config, f.Runs, f.Planned)
			continue
		}
		if f.Lossy {
			fmt.Fprintf(w, "LOSSY  %-16s %s\n", f.Config, f.Problem)
			continue
		}
		fmt.Fprintf(w, "RERUN  %-16s %s\n", f.Config, f.Problem)
		rerun = append(rerun, f.Config)
		if f.Damaged {
			damaged = append(damaged, f.Config)
		}
	}
	for _, t := range v.Temps {
		fmt.Fprintf(w, "note   %s is left from an interrupted write; it is harmless and the next sweep removes it\n", t)
	}
	if len(v.Findings) == 0 {
		fmt.Fprintf(w, "%s holds no results\n", v.Dir)
		return
	}
	if len(rerun) == 0 {
		return
	}
	fmt.Fprintf(w, "\nto rerun: %s\n", strings.Join(rerun, " "))
	if len(damaged) > 0 {
		fmt.Fprintln(w, "first delete the damaged files (they cannot be trusted or resumed):")
		for _, c := range damaged {
			name := c + ".json"
			if c == sweepFile {
				name = c
			}
			fmt.Fprintf(w, "  rm %s\n", filepath.Join(v.Dir, name))
		}
	}
	if len(v.Argv) > 0 {
		args := slices.DeleteFunc(slices.Clone(v.Argv), func(a string) bool { return a == "--resume" || a == "-resume" })
		for i, a := range args {
			args[i] = shellQuote(a)
		}
		fmt.Fprintf(w, "then: %s --resume\n", strings.Join(args, " "))
	}
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellQuote quotes an argument for a POSIX shell when it needs it.
func shellQuote(a string) string {
	if shellSafe.MatchString(a) {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}
