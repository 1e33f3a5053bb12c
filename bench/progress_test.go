package bench

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestProgressEstimatesTimeLeft(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, 400, 4)
	p.start = time.Now().Add(-10 * time.Second)
	p.begin("tp1-b15 fibonacci-256tok-c1")
	p.add(100)
	p.finish(100)
	p.printf("saved %s", "tp1-b15 fibonacci-256tok-c1")
	// A quarter done in 10 s leaves about 30 s; a log gets no bar redraws.
	m := regexp.MustCompile(`^\[1/4\] saved tp1-b15 fibonacci-256tok-c1  \(elapsed (\d+)s, left ~(\d+)s\)\n$`).FindStringSubmatch(b.String())
	if m == nil {
		t.Fatalf("progress line %q", b.String())
	}
	elapsed, _ := strconv.Atoi(m[1])
	left, _ := strconv.Atoi(m[2])
	if elapsed < 10 || elapsed > 12 || left < 3*elapsed-2 || left > 3*elapsed+2 {
		t.Errorf("elapsed %ds, left %ds: want three times the elapsed time left", elapsed, left)
	}
	p.add(1000)
	if p.position() != 400 {
		t.Errorf("done %v past the total 400", p.position())
	}
	b.Reset()
	fresh := newProgress(&b, 10, 1)
	fresh.printf("FAILED x")
	if !strings.Contains(b.String(), "left ?") {
		t.Errorf("an estimate before any work: %q", b.String())
	}
}
