package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress draws a sweep's progress with an estimate of the time left. Work
// is counted in planned output tokens, so long runs weigh more than short
// ones. On a terminal a bar is redrawn in place; elsewhere (logs, pipes)
// only the permanent lines appear, each with the estimate.
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time

	mu          sync.Mutex
	total, done float64
	runs, nruns int
	label       string
	drawn       time.Time
}

func newProgress(w io.Writer, totalUnits float64, runs int) *progress {
	if w == nil {
		w = io.Discard
	}
	p := &progress{w: w, start: time.Now(), total: totalUnits, nruns: runs}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// begin names the run in progress.
func (p *progress) begin(label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label = label
	p.draw(true)
}

// add counts finished work.
func (p *progress) add(units float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = min(p.done+units, p.total)
	p.draw(false)
}

// finish closes a run: its remaining units (requests never sent after a
// failure) count as done.
func (p *progress) finish(runEnd float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = min(max(p.done, runEnd), p.total)
	p.runs++
}

// position is the work done so far, for finish.
func (p *progress) position() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// printf writes a permanent line with the run count and time estimate.
func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "[%d/%d] %s  (%s)\n", p.runs, p.nruns, fmt.Sprintf(format, args...), p.times())
	p.draw(true)
}

func (p *progress) times() string {
	elapsed := time.Since(p.start)
	eta := "left ?"
	if p.done > 0 {
		left := time.Duration(float64(elapsed) * (p.total - p.done) / p.done)
		eta = "left ~" + left.Round(time.Second).String()
	}
	return "elapsed " + elapsed.Round(time.Second).String() + ", " + eta
}

// draw redraws the bar on a terminal, at most ten times a second unless forced.
func (p *progress) draw(force bool) {
	if !p.tty || (!force && time.Since(p.drawn) < 100*time.Millisecond) {
		return
	}
	p.drawn = time.Now()
	const width = 30
	frac := 1.0
	if p.total > 0 {
		frac = p.done / p.total
	}
	n := int(frac * width)
	fmt.Fprintf(p.w, "\r\033[K[%s%s] %3.0f%%  %s  (%s)", strings.Repeat("=", n), strings.Repeat(" ", width-n), 100*frac, p.label, p.times())
}
