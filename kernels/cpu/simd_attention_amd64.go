//go:build goexperiment.simd && amd64

package cpu

import (
	"fmt"
	"math"
	"simd/archsimd"
)

// attendAVX512 is attendHead on 16-lane vectors: scores four keys at a time
// (q·k over chunks of the head dimension, lane sums by sum4), exp16 over the
// scores, then Σ p_j·v_j per 16-lane chunk of the output. Each row's result
// depends only on its own keys, in slot order, so a verify row equals the
// same row decoded alone.
func attendAVX512(out, q, kc, vc []float32, slots []int, scores []float32, kvDim, kvOff int, scale float32) {
	clear(out)
	if len(slots) == 0 {
		return
	}
	hd := len(q)
	for _, s := range slots {
		if s*kvDim+kvOff+hd > len(kc) {
			panic(fmt.Sprintf("cpu: Attention page table points at slot %d outside the cache's %d slots", s, len(kc)/kvDim))
		}
	}
	// Head dims are multiples of 16 in practice; a tail is zero-padded.
	full := hd &^ 15
	qTail := loadPart(q[full:])
	var four [4]float32
	for j := 0; j < len(slots); j += 4 {
		var a [4]archsimd.Float32x16
		for r := range min(4, len(slots)-j) {
			k := kc[slots[j+r]*kvDim+kvOff:][:hd]
			var acc archsimd.Float32x16
			for d := 0; d < full; d += 16 {
				acc = archsimd.LoadFloat32x16Slice(k[d:]).MulAdd(archsimd.LoadFloat32x16Slice(q[d:]), acc)
			}
			if full < hd {
				acc = loadPart(k[full:]).MulAdd(qTail, acc)
			}
			a[r] = acc
		}
		sum4(a[0], a[1], a[2], a[3]).Store(&four)
		archsimd.ClearAVXUpperBits() // scalar float code follows: avoid the transition stall
		copy(scores[j:min(j+4, len(slots))], four[:])
	}
	top := float32(math.Inf(-1))
	for j := range scores {
		scores[j] *= scale
		top = max(top, scores[j])
	}
	var total archsimd.Float32x16
	for j := 0; j < len(scores); j += 16 {
		n := min(16, len(scores)-j)
		e := exp16(loadN(scores[j:], n).Sub(splat(top)))
		if n < 16 {
			e = e.Mul(loadPart(ones[:n])) // the padding lanes held exp(-top), not 0
		}
		storeN(e, scores[j:], n)
		total = total.Add(e)
	}
	h := total.GetLo().Add(total.GetHi())
	var lanes [4]float32
	h.GetLo().Add(h.GetHi()).Store(&lanes)
	archsimd.ClearAVXUpperBits()
	inv := splat(1 / ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])))
	for d := 0; d < full; d += 16 {
		var acc archsimd.Float32x16
		for j, s := range slots {
			acc = archsimd.LoadFloat32x16Slice(vc[s*kvDim+kvOff+d:]).MulAdd(splat(scores[j]), acc)
		}
		acc.Mul(inv).StoreSlice(out[d:])
	}
	if full < hd {
		var acc archsimd.Float32x16
		for j, s := range slots {
			acc = loadPart(vc[s*kvDim+kvOff+full:][:hd-full]).MulAdd(splat(scores[j]), acc)
		}
		storePart(acc.Mul(inv), out[full:])
	}
	archsimd.ClearAVXUpperBits()
}

// ones masks the valid lanes of a partial vector.
var ones = [16]float32{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}
