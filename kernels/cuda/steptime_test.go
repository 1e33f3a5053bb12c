//go:build cuda

package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"ddflash/kernels"
)

// TestStepTime times a decode step (1 row) and tree verifies (budgets 8,
// 16, 32 and 64, plus the root) through one full-attention and one GDN layer
// with their MLPs at Qwen3.6-27B's shapes (random bf16 weights, 4096 cached
// tokens), eagerly and replayed as a CUDA graph, against the bandwidth
// floor: the bytes a step must move over the HBM bandwidth. It prints a
// table; scripts/gpu-check.sh shows it last.
func TestStepTime(t *testing.T) {
	be := gpu(t)
	peak, peakFrom := hbmBandwidth(t, be)
	h := &stepHarness{tb: t, be: be, rng: rand.New(rand.NewPCG(21, 22))}
	w := newLayerWeights(h, qwen36, kernels.BF16)
	defer w.free(be)
	const context = 4096
	var table strings.Builder
	fmt.Fprintf(&table, "step-time: 1 attention + 1 GDN layer + 2 MLPs at Qwen3.6-27B shapes, %d cached tokens, %s\n", context, be.Name())
	fmt.Fprintf(&table, "bandwidth %.2f TB/s (%s); weights %.3f GB per step\n", peak/1e12, peakFrom, float64(w.bytes)/1e9)
	fmt.Fprintf(&table, "%-10s %5s %10s %10s %10s %8s\n", "step", "rows", "eager ms", "graph ms", "floor ms", "floor %")
	for _, c := range []struct {
		name string
		rows int
	}{{"decode", 1}, {"verify-8", 9}, {"verify-16", 17}, {"verify-32", 33}, {"verify-64", 65}} {
		l := newLayerStep(h, w, qwen36, c.rows, context)
		eager := medianTime(t, be, l.run)
		must(t, be.BeginCapture())
		l.run()
		g, err := be.EndCapture()
		must(t, err)
		graph := medianTime(t, be, func() { must(t, be.Launch(g)) })
		g.Close()
		floor := time.Duration(float64(l.bytes()) / peak * float64(time.Second))
		fmt.Fprintf(&table, "%-10s %5d %10.3f %10.3f %10.3f %7.0f%%\n", c.name, c.rows,
			ms(eager), ms(graph), ms(floor), 100*ms(floor)/ms(min(eager, graph)))
		l.free()
	}
	t.Log("\n" + table.String())
	if path := os.Getenv("DDFLASH_STEP_TABLE"); path != "" {
		must(t, os.WriteFile(path, []byte(table.String()), 0o644))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// medianTime warms run up, then returns the median device time of one run
// over 5 timings of 10 runs each.
func medianTime(t *testing.T, be *Backend, run func()) time.Duration {
	t.Helper()
	run()
	run()
	must(t, be.Sync())
	var times []time.Duration
	for range 5 {
		d, err := be.Time(func() {
			for range 10 {
				run()
			}
		})
		must(t, err)
		times = append(times, d/10)
	}
	slices.Sort(times)
	return times[len(times)/2]
}

// hbmBandwidth is the memory bandwidth from NVML (bus width × max memory
// clock × 2 for double data rate); without NVML it measures a large Copy
// (bytes read plus written), which runs a little under the peak.
func hbmBandwidth(t *testing.T, be *Backend) (float64, string) {
	if ret := nvml.Init(); ret == nvml.SUCCESS {
		defer nvml.Shutdown()
		if dev, ret := nvml.DeviceGetHandleByIndex(0); ret == nvml.SUCCESS {
			bus, r1 := dev.GetMemoryBusWidth()
			clock, r2 := dev.GetMaxClockInfo(nvml.CLOCK_MEM)
			if r1 == nvml.SUCCESS && r2 == nvml.SUCCESS && bus > 0 && clock > 0 {
				return float64(bus) / 8 * float64(clock) * 1e6 * 2, fmt.Sprintf("NVML: %d-bit bus at %d MHz", bus, clock)
			}
		}
	}
	const n = 256 << 20 // F32 elements: 1 GiB each way
	src, dst := mustAlloc(t, be, kernels.F32, n), mustAlloc(t, be, kernels.F32, n)
	d := medianTime(t, be, func() { be.Copy(dst, src, 1, n, n, n) })
	return 2 * 4 * n / d.Seconds(), "measured Copy"
}
