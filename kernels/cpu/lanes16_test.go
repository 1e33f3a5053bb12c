package cpu

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"ddflash/internal/half"
	"ddflash/internal/testrand"
	"ddflash/kernels"
)

// This file is a scalar model of the AVX-512 kernels' arithmetic (the
// "16-lane" numerics that every SIMD kernel set must reproduce bit for
// bit): per-lane float32 FMA chains, the fixed tree over the lanes, Exp16.
// The tests below hold each SIMD set this CPU runs (AVX-512 and AVX2 on an
// AVX-512 CPU, AVX2 on others) to it exactly, so the sets agree with each
// other wherever either is tested. Every float32 operation is written with
// an explicit conversion, which forbids the compiler to fuse it.

// fma32 is float32 a·b + c rounded once: the product is exact in float64,
// the sum is formed exactly (TwoSum) and rounded to odd in float64, which
// then rounds to float32 as the exact sum would.
func fma32(a, b, c float32) float32 {
	p, q := float64(a)*float64(b), float64(c)
	s := p + q
	bb := s - p
	if e := (p - (s - bb)) + (q - bb); e != 0 {
		bits := math.Float64bits(s)
		if (e < 0) != (s < 0) { // the exact sum is nearer zero than s
			bits--
		}
		s = math.Float64frombits(bits | 1)
	}
	return float32(s)
}

// dot16 is x·w as the AVX-512 kernels compute it: lane l accumulates
// w[i]·x[i] for i ≡ l (mod 16) by FMAs in order, the last partial vector
// zero-filled, then sum16 adds the lanes.
func dot16(x, w []float32) float32 {
	var lanes [16]float32
	for b := 0; b < len(x); b += 16 {
		for l := range lanes {
			var xl, wl float32
			if b+l < len(x) {
				xl, wl = x[b+l], w[b+l]
			}
			lanes[l] = fma32(wl, xl, lanes[l])
		}
	}
	return sum16(lanes)
}

// sum16 is sum4's tree: lanes i and i+8, then i and i+4, then adjacent
// pairs, then the two pair sums.
func sum16(v [16]float32) float32 {
	var s8 [8]float32
	for i := range s8 {
		s8[i] = float32(v[i] + v[i+8])
	}
	var s4 [4]float32
	for i := range s4 {
		s4[i] = float32(s8[i] + s8[i+4])
	}
	return float32(float32(s4[0]+s4[1]) + float32(s4[2]+s4[3]))
}

// expLane is rowmath.Exp16 on one lane.
func expLane(x float32) float32 {
	if x != x {
		return x
	}
	const ln2Hi, ln2Lo = 0.693359375, -2.12194440e-4
	v := min(float32(89), max(float32(-104), x))
	n := float32(math.RoundToEven(float64(float32(v * 1.44269504088896341))))
	r := fma32(n, -ln2Hi, v)
	r = fma32(n, -ln2Lo, r)
	p := fma32(1.9875691500e-4, r, 1.3981999507e-3)
	for _, c := range []float32{8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1} {
		p = fma32(p, r, c)
	}
	p = fma32(p, float32(r*r), float32(r+1))
	return float32(float64(p) * math.Pow(2, float64(n))) // exact in float64, rounded once as VSCALEFPS does
}

// sigmoidLane is the SIMD kernels' 1/(1+e^-x) on one lane.
func sigmoidLane(x float32) float32 { return float32(1 / float32(1+expLane(float32(x*-1)))) }

// simdSets returns the SIMD kernel sets to hold to the model, skipping the
// test where there are none.
func simdSets(t *testing.T) []kernelSet {
	sets := simdKernels()
	if len(sets) == 0 {
		t.Skip("no SIMD kernels in this build or on this CPU")
	}
	return sets
}

// sameBits fails at the first index where got and want differ in bits
// (any NaN matching any NaN: x86 propagates an operand's NaN, and which
// operand comes first is the compiler's choice).
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if g, w := got[i], want[i]; math.Float32bits(g) != math.Float32bits(w) && !(g != g && w != w) {
			t.Fatalf("%s: [%d] = %v (%#x), the 16-lane model gives %v (%#x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// normals returns n standard normal floats.
func normals(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// TestRows4Match16Lanes checks rows4 (float32 weights) and rows4BF16 of
// every SIMD set against dot16 bit for bit: a decode row (m = 1) and
// verify blocks (2 to 5, 16 and 17 rows: the AVX2 kernels' bfloat16
// tiles take x rows three at a time up to avx2ThreeRows, a chunk scratch
// beyond), k with and without a k%16 tail, under, at and over the chunks
// that the AVX2 kernels widen at a time for many x rows (avx2Chunk).
func TestRows4Match16Lanes(t *testing.T) {
	rng := testrand.Seeded(t, 40)
	const n = 8
	for _, k := range []int{5, 16, 53, 64, 200, 1024, 1040, 2100} {
		w := normals(rng, n*k)
		wh := make([]uint16, n*k)
		wb := make([]float32, n*k) // the bfloat16 weights, widened
		for i, v := range w {
			wh[i] = uint16(math.Float32bits(v) >> 16)
			wb[i] = half.BF16ToFloat32(wh[i])
		}
		for _, m := range []int{1, 2, 3, 4, 5, 16, 17} {
			x := normals(rng, m*k)
			want, wantBF16 := make([]float32, m*n), make([]float32, m*n)
			for i := range m {
				for j := range n {
					want[i*n+j] = dot16(x[i*k:(i+1)*k], w[j*k:(j+1)*k])
					wantBF16[i*n+j] = dot16(x[i*k:(i+1)*k], wb[j*k:(j+1)*k])
				}
			}
			for _, set := range simdSets(t) {
				got := make([]float32, m*n)
				set.rows4(got, n, x, m, k, w, nil)
				sameBits(t, fmt.Sprintf("%s rows4 m=%d k=%d", set.name, m, k), got, want)
				clear(got)
				set.rows4BF16(got, n, x, m, k, wh)
				sameBits(t, fmt.Sprintf("%s rows4BF16 m=%d k=%d", set.name, m, k), got, wantBF16)
			}
		}
	}
}

// TestFP8TileMatch16Lanes checks every SIMD set's tileFP8 against dot16 on
// the dequantised weights (e4m3Values·scale rounded to float32), bit for
// bit, over random bytes (each value many times over the test),
// subnormal to large scales and partial tiles.
func TestFP8TileMatch16Lanes(t *testing.T) {
	rng := testrand.Seeded(t, 41)
	for _, k := range []int{53, 256, 1040, 2100} {
		blocks := (k + kernels.FP8Block - 1) / kernels.FP8Block
		var q [4][]uint8
		deq := make([]float32, 4*k)
		scales := make([]float32, blocks)
		for b := range scales {
			scales[b] = float32(math.Ldexp(rng.ExpFloat64(), rng.IntN(134)-130)) // below fp8MaxSIMDScale
		}
		for r := range q {
			q[r] = make([]uint8, k)
			for l := range q[r] {
				q[r][l] = uint8(rng.IntN(256))
				deq[r*k+l] = e4m3Values[q[r][l]] * scales[l/kernels.FP8Block]
			}
		}
		for _, m := range []int{1, 4, 5, 16} {
			x := normals(rng, m*k)
			for _, cols := range []int{4, 3} {
				want := make([]float32, m*4)
				for i := range m {
					for r := range cols {
						want[i*4+r] = dot16(x[i*k:(i+1)*k], deq[r*k:(r+1)*k])
					}
				}
				for _, set := range simdSets(t) {
					got := make([]float32, m*4)
					set.tileFP8(got, 4, cols, x, m, k, &q, scales)
					sameBits(t, fmt.Sprintf("%s tileFP8 m=%d k=%d cols=%d", set.name, m, k, cols), got, want)
				}
			}
		}
	}
}

// activationInputs are exp's clamp points and specials, then a spread.
func activationInputs(rng *rand.Rand) []float32 {
	x := []float32{0, float32(math.Copysign(0, -1)), 1e-30, -1e-30, 1e-40, 88.5, -88.5, 89.5, -89.5, 87.3, -87.3, 103.9, -103.9, 104.5, -104.5, 300, -300,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	for len(x) < 1003 {
		x = append(x, float32(rng.Float64()*220-110))
	}
	return x
}

// TestElementwiseMatch16Lanes checks every SIMD set's activations,
// scaledExp, scaledMax, accumRows, mixRows, conv and deltaStep against the
// 16-lane model of the AVX-512 formulas, bit for bit.
func TestElementwiseMatch16Lanes(t *testing.T) {
	rng := testrand.Seeded(t, 42)
	x := activationInputs(rng)
	up := normals(rng, len(x))
	for _, set := range simdSets(t) {
		want := make([]float32, len(x))
		got := append([]float32(nil), x...)
		set.silu(got)
		for i, v := range x {
			want[i] = float32(v * sigmoidLane(v))
		}
		sameBits(t, set.name+" silu", got, want)

		set.swiglu(got, x, up)
		for i, v := range x {
			want[i] = float32(float32(v*sigmoidLane(v)) * up[i])
		}
		sameBits(t, set.name+" swiglu", got, want)

		copy(got, up)
		set.mulSigmoid(got, x)
		for i, v := range x {
			want[i] = float32(up[i] * sigmoidLane(v))
		}
		sameBits(t, set.name+" mulSigmoid", got, want)

		for _, n := range []int{1, 7, 16, 37} {
			scores := normals(rng, n)
			scores[n/2] = float32(math.Inf(-1))
			const scale = 0.37
			top := float32(math.Inf(-1))
			for _, v := range scores {
				top = max(top, float32(v*scale))
			}
			if got := set.scaledMax(scores, scale); got != top {
				t.Fatalf("%s scaledMax n=%d = %v, want %v", set.name, n, got, top)
			}
			want := make([]float32, n)
			for j, v := range scores {
				if v > float32(math.Inf(-1)) {
					want[j] = expLane(float32(float32(v*scale) - top))
				}
			}
			set.scaledExp(scores, scale, top)
			sameBits(t, fmt.Sprintf("%s scaledExp n=%d", set.name, n), scores, want)
		}

		for _, n := range []int{3, 16, 40, 75, 144} {
			const rows, stride = 5, 150
			c, b, out := normals(rng, rows), normals(rng, rows*stride), normals(rng, n)
			want := append([]float32(nil), out...)
			for r, cr := range c {
				for j := range want {
					want[j] = fma32(b[r*stride+j], cr, want[j])
				}
			}
			set.accumRows(out, c, b, stride)
			sameBits(t, fmt.Sprintf("%s accumRows n=%d", set.name, n), out, want)

			// mixRows: 4 rows of weights over 5 value rows of n, with sums.
			const nq, wStride, accStride = 4, 7, 160
			w, acc, vals := normals(rng, nq*wStride), normals(rng, nq*accStride), normals(rng, rows*n)
			sums := make([]float32, nq*attnSumStride)
			wantAcc, wantSums := append([]float32(nil), acc...), make([]float32, len(sums))
			for i := range nq {
				for u := range rows {
					for j := range n {
						wantAcc[i*accStride+j] = fma32(vals[u*n+j], w[i*wStride+u], wantAcc[i*accStride+j])
					}
					wantSums[i*attnSumStride] = float32(wantSums[i*attnSumStride] + w[i*wStride+u])
				}
			}
			set.mixRows(acc, accStride, w, wStride, nq, rows, vals, n, sums)
			for i := range nq {
				sameBits(t, fmt.Sprintf("%s mixRows n=%d row %d", set.name, n, i), acc[i*accStride:i*accStride+n], wantAcc[i*accStride:i*accStride+n])
			}
			for i := range nq { // only each row's first lane is the contract (mix3x128 stores 16)
				sameBits(t, fmt.Sprintf("%s mixRows sum of row %d n=%d", set.name, i, n), sums[i*attnSumStride:][:1], wantSums[i*attnSumStride:][:1])
			}

			taps := make([][]float32, 4)
			for j := range taps {
				taps[j] = normals(rng, n)
			}
			wT := normals(rng, len(taps)*n)
			for ch := range want[:n] {
				var s float32
				for j, in := range taps {
					s = fma32(wT[j*n+ch], in[ch], s)
				}
				want[ch] = s
			}
			conv := make([]float32, n)
			set.conv(conv, taps, wT)
			sameBits(t, fmt.Sprintf("%s conv n=%d", set.name, n), conv, want[:n])
		}

		for _, vd := range []int{5, 16, 40, 128} {
			const kd = 9
			S, q, k, v := normals(rng, kd*vd), normals(rng, kd), normals(rng, kd), normals(rng, vd)
			const g, beta = -0.3, 0.7
			decay := float32(math.Exp(g))
			wantS, wantOut := append([]float32(nil), S...), make([]float32, vd)
			for j := range vd {
				var p float32
				for i := range kd {
					p = fma32(S[i*vd+j], k[i], p)
				}
				d := float32(beta * float32(v[j]-float32(decay*p)))
				var o float32
				for i := range kd {
					s := fma32(k[i], d, float32(S[i*vd+j]*decay))
					wantS[i*vd+j] = s
					o = fma32(s, q[i], o)
				}
				wantOut[j] = o
			}
			out, delta := make([]float32, vd), make([]float32, vd)
			set.deltaStep(S, q, k, v, g, beta, out, delta)
			sameBits(t, fmt.Sprintf("%s deltaStep vd=%d state", set.name, vd), S, wantS)
			sameBits(t, fmt.Sprintf("%s deltaStep vd=%d out", set.name, vd), out, wantOut)
		}
	}
}

// TestFMA32 checks fma32 against exact arithmetic (big.Float, rounded to
// float32 once): random operands, and sums a hair off a float32 halfway
// point, where rounding through float64 first would round to even.
func TestFMA32(t *testing.T) {
	rng := testrand.Seeded(t, 43)
	exact := func(a, b, c float32) float32 {
		p := new(big.Float).SetPrec(256).SetFloat64(float64(a))
		p.Mul(p, big.NewFloat(float64(b)))
		p.Add(p, big.NewFloat(float64(c)))
		f, _ := p.Float32()
		return f
	}
	// (1 + 2^-12)² = 1 + 2^-11 + 2^-24, halfway between two float32s.
	a := float32(1 + 1.0/(1<<12))
	cases := [][3]float32{{a, a, float32(math.Ldexp(1, -80))}, {a, a, -float32(math.Ldexp(1, -80))}, {-a, a, float32(math.Ldexp(1, -90))}}
	for range 100000 {
		x, y := float32(rng.NormFloat64()), float32(rng.NormFloat64())
		c := float32(rng.NormFloat64() * math.Ldexp(1, -rng.IntN(60)))
		if rng.IntN(2) == 0 { // cancel most of the product
			c -= float32(float64(x) * float64(y))
		}
		cases = append(cases, [3]float32{x, y, c})
	}
	for _, c := range cases {
		if got, want := fma32(c[0], c[1], c[2]), exact(c[0], c[1], c[2]); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%v, %v, %v) = %v, exactly %v", c[0], c[1], c[2], got, want)
		}
	}
}
