package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"ddflash/kernels/cpu"
	"ddflash/kernels/opprofile"
)

// BenchmarkMidStep loads the mid preset (0.63B parameters, 1.27 GB of bf16
// weights) on two threads and runs two parts. profile times b.N decode
// steps op by op and prints the table (docs/cpu-profile.md): each op's time
// and bytes, the time between ops (the engine's own code), and what the
// worker pool's hand-offs cost. verify16 times decode steps and 16-row
// verify steps interleaved and reports verify time / decode time. Run:
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
	b.Run("profile", func(b *testing.B) {
		step := verifyStep(b, e, 1, nil)
		step() // warm: scratch buffers and pages
		be.StartPoolStats()
		prof.Start()
		b.ResetTimer()
		for range b.N {
			step()
		}
		wall := b.Elapsed()
		prof.Stop()
		ops := prof.Ops()
		var table strings.Builder
		opprofile.Write(&table, ops, b.N, wall)
		opsTime, _ := opprofile.Total(ops)
		pool := be.PoolStats()
		perStep := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
		share := func(d time.Duration) float64 { return 100 * float64(d) / float64(wall) }
		fmt.Fprintf(&table, "\nstep %.0f µs: ops %.0f µs, between ops %.0f µs (%.1f %%)\n",
			perStep(wall), perStep(opsTime), perStep(wall-opsTime), share(wall-opsTime))
		fmt.Fprintf(&table, "pool: %.0f parallel loops / step, %.0f split; hand-offs %.0f µs / step (%.1f %%), barrier waits %.0f µs / step (%.1f %%)\n",
			float64(pool.Calls)/float64(b.N), float64(pool.Split)/float64(b.N),
			perStep(pool.Handoff), share(pool.Handoff), perStep(pool.Wait), share(pool.Wait))
		// Printed, not logged: a benchmark's log is cut to ten lines.
		fmt.Printf("profile of %d decode steps of mid:\n%s\n", b.N, table.String())
		b.ReportMetric(float64(wall.Microseconds())/1000/float64(b.N), "ms/step")
		b.ReportMetric(float64(weights)*float64(b.N)/wall.Seconds()/1e9, "weights-GB/s")
	})
	b.Run("verify16", func(b *testing.B) {
		spent := interleaved(b, verifyStep(b, e, 1, nil), verifyStep(b, e, 16, nil))
		b.ReportMetric(spent[0].Seconds()*1000/float64(b.N), "decode-ms/step")
		b.ReportMetric(spent[1].Seconds()*1000/float64(b.N), "verify16-ms/step")
		b.ReportMetric(spent[1].Seconds()/spent[0].Seconds(), "verify16/decode")
	})
}
