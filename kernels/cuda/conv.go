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
	st, stBF16 := convState("CausalConv state", state, (K-1)*channels)
	wv, variant := weights("CausalConv w", w, channels*K)
	par := optI32s("CausalConv parents", parents, T)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("causal_conv"+variant, be.gridFor(T*channels, 256), d1(256), 0,
		o, xv, st, stBF16, wv, par, i32(T), i32(channels), i32(K))
}

// ConvCommit sets state to the last K-1 inputs of the chain ending at node.
func (be *Backend) ConvCommit(state, x, parents kernels.Buffer, node, channels, K int) {
	checkConvK("ConvCommit", K)
	st, stBF16 := convState("ConvCommit state", state, (K-1)*channels)
	if node < 0 {
		return // nothing accepted: the state stays
	}
	xv := f32s("ConvCommit x", x, (node+1)*channels)
	par := optI32s("ConvCommit parents", parents, node+1)
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("conv_commit", be.gridFor(channels, 256), d1(256), 0, st, stBF16, xv, par, i32(node), i32(channels), i32(K))
}

// convState checks an F32 or BF16 conv state of at least n elements and
// returns the kernels' state_bf16 flag.
func convState(op string, state kernels.Buffer, n int) (*buffer, int32) {
	st, variant := weights(op, state, n)
	switch variant {
	case "_f32":
		return st, 0
	case "_bf16":
		return st, 1
	}
	panic(fmt.Sprintf("cuda: %s needs an F32 or BF16 state, got %v", op, st.dt))
}
