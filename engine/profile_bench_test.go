package engine

import (
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"ddflash/kernels/cpu"
	"ddflash/kernels/opprofile"
)

// BenchmarkMidStep loads the mid preset (0.63B parameters, 1.27 GB of bf16
// weights) on two threads and runs two parts. profile times b.N decode
// steps (rows1) and 16-row verify steps (rows16) op by op and prints the
// table (docs/cpu-profile.md): each op's time and bytes, the time between
// ops (the engine's own code), and what the worker pool's hand-offs cost.
// verify16 times decode steps and 16-row verify steps interleaved and
// reports verify time / decode time, from the mean steps and from the
// least (on a shared machine, the steps that had the cores to themselves).
// Run:
//
//	GOEXPERIMENT=simd go test ./engine/ -run '^$' -bench MidStep -benchtime 20x
func BenchmarkMidStep(b *testing.B) {
	be := cpu.New(2).(*cpu.Backend)
	prof := opprofile.New(be)
	dir := writeTestModel(b, "mid", 1, "bf16")
	weights := stepWeightBytes(b, dir)
	e, err := Load(prof, dir, Options{Context: 1024, VerifyTokens: 16, MaxSeqs: 4})
	if err != nil {
		b.Fatal(err)
	}
	for _, rows := range []int{1, 16} {
		b.Run(fmt.Sprintf("profile/rows%d", rows), func(b *testing.B) {
			step := verifyStep(b, e, rows, nil)
			step() // warm: scratch buffers and pages
			be.StartPoolStats()
			prof.Start()
			b.ResetTimer()
			for range b.N {
				step()
			}
			wall := b.Elapsed()
			prof.Stop()
			// Printed, not logged: a benchmark's log is cut to ten lines.
			fmt.Printf("profile of %d steps of mid over %d rows:\n", b.N, rows)
			writeProfile(os.Stdout, prof.Ops(), be.PoolStats(), b.N, wall)
			b.ReportMetric(float64(wall.Microseconds())/1000/float64(b.N), "ms/step")
			b.ReportMetric(float64(weights)*float64(b.N)/wall.Seconds()/1e9, "weights-GB/s")
		})
	}
	b.Run("verify16", func(b *testing.B) {
		spent, least := interleaved(b, verifyStep(b, e, 1, nil), verifyStep(b, e, 16, nil))
		b.ReportMetric(spent[0].Seconds()*1000/float64(b.N), "decode-ms/step")
		b.ReportMetric(spent[1].Seconds()*1000/float64(b.N), "verify16-ms/step")
		b.ReportMetric(spent[1].Seconds()/spent[0].Seconds(), "verify16/decode")
		b.ReportMetric(least[0].Seconds()*1000, "best-decode-ms")
		b.ReportMetric(least[1].Seconds()*1000, "best-verify16-ms")
		b.ReportMetric(least[1].Seconds()/least[0].Seconds(), "best-verify16/decode")
	})
}

// writeProfile prints a profile of steps steps that took wall in all: the
// ops' table, the time between ops, and the pool's hand-offs and barriers.
func writeProfile(w io.Writer, ops []opprofile.Op, pool cpu.PoolStats, steps int, wall time.Duration) {
	opprofile.Write(w, ops, steps, wall)
	opsTime, _ := opprofile.Total(ops)
	perStep := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(steps) }
	share := func(d time.Duration) float64 { return 100 * float64(d) / float64(wall) }
	fmt.Fprintf(w, "\nstep %.0f µs: ops %.0f µs, between ops %.0f µs (%.1f %%)\n",
		perStep(wall), perStep(opsTime), perStep(wall-opsTime), share(wall-opsTime))
	fmt.Fprintf(w, "pool: %.0f parallel loops / step, %.0f split; hand-offs %.0f µs / step (%.1f %%), barrier waits %.0f µs / step (%.1f %%)\n\n",
		float64(pool.Calls)/float64(steps), float64(pool.Split)/float64(steps),
		perStep(pool.Handoff), share(pool.Handoff), perStep(pool.Wait), share(pool.Wait))
}
