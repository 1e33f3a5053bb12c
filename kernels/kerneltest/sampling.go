package kerneltest

import (
	"fmt"
	"math"
	"sort"

	"ddflash/kernels"
)

// testLogSoftmax uses rows with a large common offset (a naive exp
// overflows) and a one-element row. Bound: 8 ulps of the row's largest
// logit plus 1e-6, the rounding of x − logsumexp.
func testLogSoftmax(h *harness) {
	for _, c := range []struct {
		rows, n int
		offset  float64
	}{{3, 37, 0}, {2, 50, 1000}, {2, 1, -3}} {
		x := h.normal(c.rows*c.n, 4)
		for i := range x {
			x[i] += float32(c.offset)
		}
		xb := h.f32(x)
		h.be.LogSoftmax(xb, c.rows, c.n)
		want, scale := make([]float64, len(x)), make([]float64, len(x))
		for r := range c.rows {
			row := x[r*c.n : (r+1)*c.n]
			top := math.Inf(-1)
			for _, v := range row {
				top = math.Max(top, float64(v))
			}
			var sum float64
			for _, v := range row {
				sum += math.Exp(float64(v) - top)
			}
			for i, v := range row {
				want[r*c.n+i] = float64(v) - top - math.Log(sum)
				scale[r*c.n+i] = math.Abs(top) + math.Abs(want[r*c.n+i])
			}
		}
		h.expectClose(fmt.Sprintf("LogSoftmax rows=%d n=%d offset=%g", c.rows, c.n, c.offset), h.read(xb, len(x)), want, scale, tolerance{1e-6, 8 * f32Unit})
	}
}

// testTopK draws values from a few levels so that ties are common; the
// expected order is a stable sort by descending value. Exact.
func testTopK(h *harness) {
	const rows, n = 3, 29
	for _, k := range []int{1, 5, n} {
		x := make([]float32, rows*n)
		for i := range x {
			x[i] = float32(h.rng.IntN(6)) - 2.5
		}
		vals, idx := h.alloc(kernels.F32, rows*k), h.alloc(kernels.I32, rows*k)
		h.be.TopK(vals, idx, h.f32(x), rows, n, k)
		wantVals, wantIdx := make([]float32, 0, rows*k), make([]float32, 0, rows*k)
		for r := range rows {
			order := make([]int, n)
			for i := range order {
				order[i] = i
			}
			row := x[r*n : (r+1)*n]
			sort.SliceStable(order, func(a, b int) bool { return row[order[a]] > row[order[b]] })
			for _, i := range order[:k] {
				wantVals = append(wantVals, row[i])
				wantIdx = append(wantIdx, float32(i))
			}
		}
		h.expectEqual(fmt.Sprintf("TopK k=%d values", k), h.read(vals, rows*k), wantVals)
		h.expectEqual(fmt.Sprintf("TopK k=%d indices", k), h.read(idx, rows*k), wantIdx)
	}
}
