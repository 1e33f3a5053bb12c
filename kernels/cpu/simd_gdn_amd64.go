//go:build goexperiment.simd && amd64

package cpu

import "simd/archsimd"

// loadN loads n ≤ 16 floats, zero-filling the rest.
func loadN(s []float32, n int) archsimd.Float32x16 {
	if n == 16 {
		return archsimd.LoadFloat32x16Slice(s)
	}
	return loadPart(s[:n])
}

// storeN stores the first n ≤ 16 lanes of x.
func storeN(x archsimd.Float32x16, s []float32, n int) {
	if n == 16 {
		x.StoreSlice(s)
		return
	}
	storePart(x, s[:n])
}

// accumRowsAVX512 is accumRowsPortable 64 lanes at a time: four
// accumulators stay in registers while the rows of b stream past, one
// broadcast and four FMAs per row; the last n%64 lanes go 16 at a time.
func accumRowsAVX512(out, c, b []float32, stride int) {
	n := len(out)
	if len(c) == 0 || n == 0 {
		return
	}
	b = b[:(len(c)-1)*stride+n]
	j := 0
	for ; j+64 <= n; j += 64 {
		o := out[j : j+64]
		a0, a1, a2, a3 := archsimd.LoadFloat32x16Slice(o), archsimd.LoadFloat32x16Slice(o[16:]), archsimd.LoadFloat32x16Slice(o[32:]), archsimd.LoadFloat32x16Slice(o[48:])
		for r, cr := range c {
			row, cv := b[r*stride+j:r*stride+j+64], splat(cr)
			a0 = archsimd.LoadFloat32x16Slice(row).MulAdd(cv, a0)
			a1 = archsimd.LoadFloat32x16Slice(row[16:]).MulAdd(cv, a1)
			a2 = archsimd.LoadFloat32x16Slice(row[32:]).MulAdd(cv, a2)
			a3 = archsimd.LoadFloat32x16Slice(row[48:]).MulAdd(cv, a3)
		}
		a0.StoreSlice(o)
		a1.StoreSlice(o[16:])
		a2.StoreSlice(o[32:])
		a3.StoreSlice(o[48:])
	}
	for ; j < n; j += 16 {
		lanes := min(16, n-j)
		a := loadN(out[j:], lanes)
		for r, cr := range c {
			a = loadN(b[r*stride+j:], lanes).MulAdd(splat(cr), a)
		}
		storeN(a, out[j:], lanes)
	}
	archsimd.ClearAVXUpperBits()
}
