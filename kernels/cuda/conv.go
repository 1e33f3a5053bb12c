//go:build cgo

package cuda

import (
	"fmt"

	"ddflash/kernels"
)

// maxConvK is MAX_CONV_K in conv.cu.
const maxConvK = 16

func checkConvK(op string, K int) {
	if K < 1 || K > maxConvK {
		panic(fmt.Sprintf("cuda: %s kernel size %d: the kernels support 1..%d", op, K, maxConvK))
	}
}

// CausalConv runs the depthwise causal conv + SiLU over rows whose history
// is their ancestor chain. A parent that is not an earlier row traps.
func (be *Backend) CausalConv(out, x, state, w, parents kernels.Buffer, T, channels, K int) {
	checkConvK("CausalConv", K)
	o, xv := f32s("CausalConv out", out, T*channels), f32s("CausalConv x", x, T*channels)
	st := f32s("CausalConv state", state, (K-1)*channels)
	wv, variant := weights("CausalConv w", w, channels*K)
	par := optI32s("CausalConv parents", parents, T)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("causal_conv"+variant, be.gridFor(T*channels, 256), d1(256), 0,
		o, xv, st, wv, par, i32(T), i32(channels), i32(K))
}

// ConvCommit sets state to the last K-1 inputs of the chain ending at node.
func (be *Backend) ConvCommit(state, x, parents kernels.Buffer, node, channels, K int) {
	checkConvK("ConvCommit", K)
	st := f32s("ConvCommit state", state, (K-1)*channels)
	if node < 0 {
		return // nothing accepted: the state stays
	}
	xv := f32s("ConvCommit x", x, (node+1)*channels)
	par := optI32s("ConvCommit parents", parents, node+1)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("conv_commit", be.gridFor(channels, 256), d1(256), 0, st, xv, par, i32(node), i32(channels), i32(K))
}
