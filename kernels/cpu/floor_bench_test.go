//go:build goexperiment.simd && amd64

package cpu

import (
	"fmt"
	"math/rand/v2"
	"simd/archsimd"
	"sync"
	"testing"
	"time"
	"unsafe"

	"ddflash/kernels"
)

// BenchmarkMatMulFloor sets MatMul on the mid preset's largest projections
// against the machine's ceilings, measured in the same run on the same
// threads (issue 33 items 2 and 5): a decode row (m=1) against a read of
// the same weights (a vectorised sum, the floor a decode row can reach), a
// 16-row verify block against the FMA peak (independent FMA chains), and the
// verify block's time over the decode row's, from the mean times and from
// the least. Each iteration runs the four once, in turn, so that the load
// of a shared machine falls on all of them alike. The weights rotate over
// copies far larger than the L3, so that each call reads them from memory
// as a step does. Run:
//
//	GOEXPERIMENT=simd go test ./kernels/cpu/ -run '^$' -bench MatMulFloor -benchtime 100x
func BenchmarkMatMulFloor(b *testing.B) {
	const copies = 8 // of 19 MB: 151 MB of weights
	rng := rand.New(rand.NewPCG(1, 2))
	for _, kn := range [][2]int{{1536, 6144}, {6144, 1536}} {
		k, n := kn[0], kn[1]
		ws := make([]kernels.Buffer, copies)
		for i := range ws {
			ws[i] = benchWeights(b, New(1), kernels.BF16, n*k, rng)
		}
		for _, threads := range []int{1, 2} {
			be := New(threads).(*Backend)
			x1 := benchActivations(b, be, k, rng)
			x16 := benchActivations(b, be, 16*k, rng)
			out, _ := be.Alloc(kernels.F32, 16*n)
			b.Run(fmt.Sprintf("k=%d/n=%d/threads=%d", k, n, threads), func(b *testing.B) {
				// decode, verify, the read of the weights, the FMA peak:
				// their total and least times
				var spent, least [4]time.Duration
				timed := func(part int, f func()) {
					t0 := time.Now()
					f()
					d := time.Since(t0)
					spent[part] += d
					if least[part] == 0 || d < least[part] {
						least[part] = d
					}
				}
				peakIters := 16 * n * k / (16 * 8) // as many FMAs as the verify block
				for i := range b.N {
					// Each part reads a copy that no part has read for
					// the last two iterations (over 100 MB ago).
					timed(0, func() { be.MatMul(out, x1, ws[i%copies], 1, n, k) })
					timed(1, func() { be.MatMul(out, x16, ws[(i+3)%copies], 16, n, k) })
					timed(2, func() { be.readAll(ws[(i+6)%copies]) })
					timed(3, func() { be.fmaPeak(peakIters) })
				}
				// The means, and the least times: on a shared machine the
				// least are the calls that had the cores to themselves.
				bytes, flops := float64(2*n*k), float64(2*16*n*k)
				for _, t := range []struct {
					prefix string
					d      [4]time.Duration
					calls  int
				}{{"", spent, b.N}, {"best-", least, 1}} {
					sec := func(part int) float64 { return t.d[part].Seconds() / float64(t.calls) }
					b.ReportMetric(bytes/sec(0)/1e9, t.prefix+"decode-GB/s")
					b.ReportMetric(100*sec(2)/sec(0), t.prefix+"decode-%read")
					b.ReportMetric(flops/sec(1)/1e9, t.prefix+"verify16-GFLOP/s")
					b.ReportMetric(100*sec(3)/sec(1), t.prefix+"verify16-%peak")
					b.ReportMetric(sec(1)/sec(0), t.prefix+"verify16/decode")
				}
			})
		}
	}
}

// BenchmarkDot4x4BF16 times the verify kernel alone, on one tile of four
// bfloat16 weight rows and four x rows of mid's k that stay in L1 (12 and
// 24 KB), against as many FMAs of the FMA peak on the same core, in turn:
// the share of the peak that its widening, loads and reduction leave
// (mean and least times of 100 calls).
func BenchmarkDot4x4BF16(b *testing.B) {
	if !archsimd.X86.AVX512() {
		b.Skip("dot4x4BF16 is an AVX-512 kernel")
	}
	const k, calls = 1536, 100
	be := New(1).(*Backend)
	rng := rand.New(rand.NewPCG(1, 2))
	w := make([]uint16, 4*k)
	x := make([]float32, 4*k)
	for i := range w {
		w[i] = uint16(rng.Uint32()) &^ 0x4000 // exponents up to 2^0: no NaNs
		x[i] = float32(rng.NormFloat64())
	}
	var out [16]float32
	row := func(r int) unsafe.Pointer { return unsafe.Pointer(&w[r*k]) }
	var spent, least [2]time.Duration
	for range b.N {
		for part, f := range [2]func(){
			func() {
				for range calls {
					dot4x4BF16(row(0), row(1), row(2), row(3), unsafe.Pointer(&x[0]), k, unsafe.Pointer(&out[0]), 4, 0)
				}
			},
			func() { be.fmaPeak(calls * k / 8) }, // dot4x4BF16 runs k vector FMAs
		} {
			t0 := time.Now()
			f()
			d := time.Since(t0)
			spent[part] += d
			if least[part] == 0 || d < least[part] {
				least[part] = d
			}
		}
	}
	flops := float64(2 * 16 * k * calls)
	b.ReportMetric(flops*float64(b.N)/spent[0].Seconds()/1e9, "kernel-GFLOP/s")
	b.ReportMetric(100*spent[1].Seconds()/spent[0].Seconds(), "kernel-%peak")
	b.ReportMetric(flops/least[0].Seconds()/1e9, "best-kernel-GFLOP/s")
	b.ReportMetric(flops/least[1].Seconds()/1e9, "best-peak-GFLOP/s")
	b.ReportMetric(100*least[1].Seconds()/least[0].Seconds(), "best-kernel-%peak")
}

// readAll sums a BF16 buffer's memory on the backend's threads, 64 bytes
// per load (32 without AVX-512) into independent sums (as float32s: the
// sum is discarded, only the reads count).
func (be *Backend) readAll(w kernels.Buffer) {
	u16 := asBuffer(w).u16
	words := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(u16))), len(u16)/2)
	const block = 64 // floats per item: four vectors
	be.pool.parallelFor(len(words)/block, block, func(lo, hi int) {
		if !archsimd.X86.AVX512() {
			var s0, s1, s2, s3 archsimd.Float32x8
			for i := lo * block; i < hi*block; i += 32 {
				s0 = s0.Add(archsimd.LoadFloat32x8Slice(words[i:]))
				s1 = s1.Add(archsimd.LoadFloat32x8Slice(words[i+8:]))
				s2 = s2.Add(archsimd.LoadFloat32x8Slice(words[i+16:]))
				s3 = s3.Add(archsimd.LoadFloat32x8Slice(words[i+24:]))
			}
			keep8(s0.Add(s1).Add(s2.Add(s3)))
			return
		}
		var s0, s1, s2, s3 archsimd.Float32x16
		for i := lo * block; i < hi*block; i += block {
			s0 = s0.Add(archsimd.LoadFloat32x16Slice(words[i:]))
			s1 = s1.Add(archsimd.LoadFloat32x16Slice(words[i+16:]))
			s2 = s2.Add(archsimd.LoadFloat32x16Slice(words[i+32:]))
			s3 = s3.Add(archsimd.LoadFloat32x16Slice(words[i+48:]))
		}
		keep(s0.Add(s1).Add(s2.Add(s3)))
	})
}

// fmaPeak runs iters iterations of eight independent FMAs over 16 lanes
// (without AVX-512, twice as many over 8 lanes), split over the backend's
// threads: enough chains to keep both FMA units of a core busy through
// the FMA latency.
func (be *Backend) fmaPeak(iters int) {
	const items = 64
	be.pool.parallelFor(items, 1<<30, func(lo, hi int) {
		if !archsimd.X86.AVX512() {
			var a0, a1, a2, a3, a4, a5, a6, a7 archsimd.Float32x8
			x := archsimd.BroadcastFloat32x8(1)
			y := archsimd.BroadcastFloat32x8(0x1p-20)
			for range 2 * (hi - lo) * iters / items {
				a0, a1, a2, a3 = x.MulAdd(y, a0), x.MulAdd(y, a1), x.MulAdd(y, a2), x.MulAdd(y, a3)
				a4, a5, a6, a7 = x.MulAdd(y, a4), x.MulAdd(y, a5), x.MulAdd(y, a6), x.MulAdd(y, a7)
			}
			keep8(a0.Add(a1).Add(a2.Add(a3)).Add(a4.Add(a5).Add(a6.Add(a7))))
			return
		}
		var a0, a1, a2, a3, a4, a5, a6, a7 archsimd.Float32x16
		x := archsimd.BroadcastFloat32x16(1)
		y := archsimd.BroadcastFloat32x16(0x1p-20)
		for range (hi - lo) * iters / items {
			a0, a1, a2, a3 = x.MulAdd(y, a0), x.MulAdd(y, a1), x.MulAdd(y, a2), x.MulAdd(y, a3)
			a4, a5, a6, a7 = x.MulAdd(y, a4), x.MulAdd(y, a5), x.MulAdd(y, a6), x.MulAdd(y, a7)
		}
		keep(a0.Add(a1).Add(a2.Add(a3)).Add(a4.Add(a5).Add(a6.Add(a7))))
	})
}

// sink keeps the probes' results live, so that their loads and FMAs stay.
var sink struct {
	sync.Mutex
	sum float32
}

func keep(v archsimd.Float32x16) { keep8(v.GetLo()) }

func keep8(v archsimd.Float32x8) {
	var lanes [8]float32
	v.Store(&lanes)
	archsimd.ClearAVXUpperBits()
	sink.Lock()
	sink.sum += lanes[0]
	sink.Unlock()
}
