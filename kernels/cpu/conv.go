package cpu

import (
	"fmt"

	"ddflash/internal/half"
	"ddflash/kernels"
)

// convSource names one input row of the conv window: a row of x when >= 0,
// else row -1-src of the committed state.
type convSource int

// convHistory returns, per row t, its K input rows oldest first: the K-1
// ancestors of t (parents, or the preceding rows when parents is nil),
// continued into the committed state, then t itself.
func convHistory(parents []int32, T, K int) []convSource {
	src := make([]convSource, T*K)
	for t := range T {
		row := src[t*K : (t+1)*K]
		row[K-1] = convSource(t)
		node, stateRow := parentOf(parents, t), K-2
		for j := K - 2; j >= 0; j-- {
			if node >= 0 {
				row[j] = convSource(node)
				node = parentOf(parents, node)
				continue
			}
			row[j] = convSource(-1 - stateRow)
			stateRow--
		}
	}
	return src
}

// parentOf is the chain or tree parent of row t; -1 is the committed state.
func parentOf(parents []int32, t int) int {
	if parents == nil {
		return t - 1
	}
	return int(parents[t])
}

// treeParents returns the parents of a tree op, checking parents[t] < t, or
// nil for a chain.
func treeParents(op string, parents kernels.Buffer, T int) []int32 {
	if parents == nil {
		return nil
	}
	p := i32s(op+" parents", parents, T)
	for t, pt := range p {
		if pt < -1 || int(pt) >= t {
			panic(fmt.Sprintf("cpu: %s parents[%d] = %d: must be -1 or an earlier row", op, t, pt))
		}
	}
	return p
}

// CausalConv runs the depthwise causal conv + SiLU over rows whose history
// is their ancestor chain. Each row is computed alone from its window, so
// a verify block matches decoding (with a BF16 state too: see roundedBF16).
func (be *Backend) CausalConv(out, x, state, w, parents kernels.Buffer, T, channels, K int) {
	o, xv := f32s("CausalConv out", out, T*channels), f32s("CausalConv x", x, T*channels)
	stTemp, stBuf := be.temps.get((K - 1) * channels)
	defer be.temps.put(stTemp)
	st := convState("CausalConv state", state, stBuf)
	wv := widened("CausalConv w", w, channels*K)
	wTemp, wT := be.temps.get(K * channels) // [K, channels]: tap j of every channel is contiguous
	defer be.temps.put(wTemp)
	for c := range channels {
		for j := range K {
			wT[j*channels+c] = wv[c*K+j]
		}
	}
	history := convHistory(treeParents("CausalConv", parents, T), T, K)
	past := xv // x as a row's history sees it: as the state holds it once committed
	if asBuffer(state).dt == kernels.BF16 {
		pastTemp, pastBuf := be.temps.get(T * channels)
		defer be.temps.put(pastTemp)
		past = roundedBF16(xv, pastBuf)
	}
	be.pool.parallelFor(T, K*channels, func(lo, hi int) {
		window := make([][]float32, K)
		for t := lo; t < hi; t++ {
			for j, s := range history[t*K : (t+1)*K] {
				switch {
				case j == K-1: // the row's own input
					window[j] = xv[t*channels : (t+1)*channels]
				case s >= 0:
					window[j] = past[int(s)*channels : int(s+1)*channels]
				default:
					window[j] = st[(-1-int(s))*channels : -int(s)*channels]
				}
			}
			row := o[t*channels : (t+1)*channels]
			be.kern.conv(row, window, wT)
			be.kern.silu(row)
		}
	})
}

func convPortable(out []float32, window [][]float32, wT []float32) {
	n := len(out)
	for c := range out {
		var sum float32
		for j, in := range window {
			sum += wT[j*n+c] * in[c]
		}
		out[c] = sum
	}
}

// ConvCommit sets state to the last K-1 inputs of the chain ending at node.
func (be *Backend) ConvCommit(state, x, parents kernels.Buffer, node, channels, K int) {
	stTemp, stBuf := be.temps.get((K - 1) * channels)
	defer be.temps.put(stTemp)
	st := convState("ConvCommit state", state, stBuf)
	if node < 0 {
		return // nothing accepted: the state stays
	}
	xv := f32s("ConvCommit x", x, (node+1)*channels)
	history := convHistory(treeParents("ConvCommit", parents, node+1), node+1, K)
	// The new state is the window of node+1 minus its oldest row, so read it
	// fully before overwriting rows of the old state it may draw on.
	window := history[node*K+1 : (node+1)*K]
	nextTemp, next := be.temps.get((K - 1) * channels)
	defer be.temps.put(nextTemp)
	for j, s := range window {
		if s >= 0 {
			copy(next[j*channels:(j+1)*channels], xv[int(s)*channels:])
		} else {
			copy(next[j*channels:(j+1)*channels], st[(-1-int(s))*channels:])
		}
	}
	storeConvState(state, next)
}

// roundedBF16 writes x rounded to nearest even BF16 into past (as long):
// x as a BF16 conv state holds it once committed, so that a row in a block
// sees what it sees decoded after its history was committed.
func roundedBF16(x, past []float32) []float32 {
	for i, v := range x {
		past[i] = half.BF16ToFloat32(half.Float32ToBF16(v))
	}
	return past
}

// convState returns a conv state's len(tmp) values: an F32 state itself,
// a BF16 one widened (exactly) into tmp.
func convState(op string, state kernels.Buffer, tmp []float32) []float32 {
	buf := asBuffer(state)
	if buf.dt != kernels.BF16 {
		return f32s(op, state, len(tmp))
	}
	checkLen(op, buf, len(tmp))
	widenInto(tmp, buf.u16[:len(tmp)], buf.dt)
	return tmp
}

// storeConvState writes values into a conv state, rounding to nearest
// even when it is BF16.
func storeConvState(state kernels.Buffer, values []float32) {
	st := asBuffer(state)
	if st.dt == kernels.F32 {
		copy(st.f32, values)
		return
	}
	for i, v := range values {
		st.u16[i] = half.Float32ToBF16(v)
	}
}
