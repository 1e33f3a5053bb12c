package dflash

import (
	"fmt"
	"math"

	"ddflash/ddtree"
	"ddflash/engine"
	"ddflash/kernels"
)

// This file holds what a DFlash2 drafter adds to DFlash (docs/dflash2.md):
// a grouped dynamic convolution around every attention and MLP sublayer,
// and the candidate selector that turns the proposal logits into a lattice.
// Both run their arithmetic on the host: the backend has no elementwise
// product for the convolution, and the selector's work (top-K, K² scores
// of rank R per position) is small; the matrix products (the dynamic
// kernels' projection, the selector's hidden projection, the codebook
// gathers) run on the backend.

// convWeights is one grouped dynamic convolution: static taps for its two
// sides (the sublayer's input and output) and the projection that makes
// both sides' per-group dynamic taps from the sublayer's input.
type convWeights struct {
	Base       kernels.Buffer // [2, taps, hidden] F32
	Projection kernels.Buffer // [2·taps·groups, hidden]
	base       []float32      // Base on the host
}

// selectorWeights is DFlash2's candidate selector.
type selectorWeights struct {
	HiddenProjection kernels.Buffer // [rank, hidden]
	Predecessor      kernels.Buffer // [vocab, rank]: A, the codebook of the previous token
	Successor        kernels.Buffer // [vocab, rank]: B, the codebook of the candidate
}

// v2Specs lists the DFlash2 tensors, named as the published checkpoints
// name them.
func (d *Drafter) v2Specs() []engine.TensorSpec {
	c := d.Cfg
	h, taps, rank := c.HiddenSize, c.V2.ConvKernelSize, c.V2.SelectorRank
	specs := []engine.TensorSpec{
		{Name: "candidate_selector.hidden_projection.weight", Shape: []int{rank, h}, Dst: &d.selector.HiddenProjection},
		{Name: "candidate_selector.predecessor_codebook", Shape: []int{c.VocabSize, rank}, Dst: &d.selector.Predecessor},
		{Name: "candidate_selector.successor_codebook", Shape: []int{c.VocabSize, rank}, Dst: &d.selector.Successor},
	}
	for i := range d.layers {
		for _, conv := range []struct {
			name string
			w    *convWeights
		}{{"attention_conv", &d.layers[i].attnConv}, {"mlp_conv", &d.layers[i].mlpConv}} {
			p := fmt.Sprintf("layers.%d.%s.", i, conv.name)
			specs = append(specs,
				engine.TensorSpec{Name: p + "base_kernel", Shape: []int{2, taps, h}, ToF32: true, Dst: &conv.w.Base},
				engine.TensorSpec{Name: p + "kernel_projection.weight", Shape: []int{2 * taps * c.ConvGroups(), h}, Dst: &conv.w.Projection})
		}
	}
	return specs
}

// downloadConvBases copies the static taps to the host, where the
// convolutions run.
func (d *Drafter) downloadConvBases() error {
	n := 2 * d.Cfg.V2.ConvKernelSize * d.Cfg.HiddenSize
	for i := range d.layers {
		for _, w := range []*convWeights{&d.layers[i].attnConv, &d.layers[i].mlpConv} {
			w.base = make([]float32, n)
			if err := d.b.DownloadF32(w.Base, 0, w.base); err != nil {
				return err
			}
		}
	}
	return nil
}

// groupedConv computes one side of a grouped dynamic convolution over a
// block of rows of width hidden:
//
//	out[i,c] = Σ_t (base[side,t,c] + delta[i,side,t,c/groupSize]) · x[i−t,c]
//
// for taps t < taps, where rows before the block's first are zero. base is
// [2, taps, hidden]; delta has a row [2, taps, hidden/groupSize] per block
// row. out must not alias x.
func groupedConv(out, x, base, delta []float32, side, rows, hidden, taps, groupSize int) {
	groups := hidden / groupSize
	for i := range rows {
		o := out[i*hidden : (i+1)*hidden]
		clear(o)
		dyn := delta[i*2*taps*groups+side*taps*groups:]
		for t := 0; t < taps && t <= i; t++ {
			src := x[(i-t)*hidden : (i-t+1)*hidden]
			b := base[(side*taps+t)*hidden:]
			for c := range o {
				o[c] += (b[c] + dyn[t*groups+c/groupSize]) * src[c]
			}
		}
	}
}

// convScratch is a draft step's host and device room for the convolutions.
type convScratch struct {
	delta    kernels.Buffer // [rows, 2·taps·groups] on the backend
	in, out  []float32      // a sublayer's input or output, and the convolved rows
	dynamics []float32      // the delta of the sublayer in flight
}

// convIn convolves a sublayer's input u (rows of the block) in place with
// side 0 and keeps the dynamic taps of both sides for convOut. A DFlash
// drafter has no convolutions: nothing happens.
func (d *Drafter) convIn(w *convWeights, s *convScratch, u kernels.Buffer, rows int) error {
	c := d.Cfg
	if c.V2 == nil {
		return nil
	}
	d.b.MatMul(s.delta, u, w.Projection, rows, 2*c.V2.ConvKernelSize*c.ConvGroups(), c.HiddenSize)
	if err := d.b.DownloadF32(s.delta, 0, s.dynamics); err != nil {
		return err
	}
	return d.convolve(w, s, u, 0, rows)
}

// convOut convolves a sublayer's output y in place with side 1 and the
// dynamic taps convIn made from the sublayer's input (nothing for DFlash).
func (d *Drafter) convOut(w *convWeights, s *convScratch, y kernels.Buffer, rows int) error {
	if d.Cfg.V2 == nil {
		return nil
	}
	return d.convolve(w, s, y, 1, rows)
}

func (d *Drafter) convolve(w *convWeights, s *convScratch, x kernels.Buffer, side, rows int) error {
	c := d.Cfg
	if err := d.b.DownloadF32(x, 0, s.in); err != nil {
		return err
	}
	groupedConv(s.out, s.in, w.base, s.dynamics, side, rows, c.HiddenSize, c.V2.ConvKernelSize, c.V2.ConvGroupSize)
	return d.b.UploadF32(x, 0, s.out)
}

// scaleRows multiplies n values of x by scale (input_embedding_scale).
func (d *Drafter) scaleRows(x kernels.Buffer, n int, scale float64) error {
	v := make([]float32, n)
	if err := d.b.DownloadF32(x, 0, v); err != nil {
		return err
	}
	for i := range v {
		v[i] = float32(float64(v[i]) * scale)
	}
	return d.b.UploadF32(x, 0, v)
}

// unary applies DFlash2's output multiplier and final soft cap to logits in
// place: the selector's unary scores, and the logits a DFlash2 Draft returns.
func (c *V2Config) unary(logits []float32) {
	if c.OutputMultiplier == 1 && c.FinalLogitSoftcap <= 0 {
		return
	}
	for i, v := range logits {
		x := float64(v) * c.OutputMultiplier
		if cap := c.FinalLogitSoftcap; cap > 0 {
			x = cap * math.Tanh(x/cap)
		}
		logits[i] = float32(x)
	}
}

// selectLattice runs the candidate selector over the proposal rows
// (final-normed hidden states, on the backend) and their unary logits
// (rows of the target vocabulary, on the host): each row's top-K tokens,
// scored after every candidate of the previous row (the anchor for the
// first) by
//
//	score(p → c) = unary[c] + ⟨A[p] ⊙ P·h, B[c]⟩
//
// with A, B the predecessor and successor codebooks and P the hidden
// projection.
func (d *Drafter) selectLattice(a *arena, proposals kernels.Buffer, logits []float32, anchor int32, rows int) (*ddtree.Lattice, error) {
	c, sel := d.Cfg, &d.selector
	H, V, K, R := c.HiddenSize, d.target.Cfg.VocabSize, c.V2.SelectorTopK, c.V2.SelectorRank
	valid := d.target.ValidVocab
	if valid <= 0 || valid > V {
		valid = V
	}
	lattice := &ddtree.Lattice{}
	var unary [][]float64
	predIDs, succIDs := []int32{anchor}, []int32(nil)
	for l := range rows {
		var tokens []int32
		var scores []float64
		for _, cand := range ddtree.TopLogits(logits[l*V:(l+1)*V], valid, K) {
			tokens, scores = append(tokens, cand.Token), append(scores, cand.Logprob)
		}
		lattice.Tokens, unary = append(lattice.Tokens, tokens), append(unary, scores)
		succIDs = append(succIDs, tokens...)
		if l < rows-1 {
			predIDs = append(predIDs, tokens...)
		}
	}
	projBuf, predBuf, succBuf := a.f32(rows*R), a.f32(len(predIDs)*R), a.f32(len(succIDs)*R)
	predIDBuf, succIDBuf := a.i32(predIDs), a.i32(succIDs)
	if a.err != nil {
		return nil, a.err
	}
	d.b.MatMul(projBuf, proposals, sel.HiddenProjection, rows, R, H)
	d.b.Embedding(predBuf, sel.Predecessor, predIDBuf, len(predIDs), R)
	d.b.Embedding(succBuf, sel.Successor, succIDBuf, len(succIDs), R)
	proj, pred, succ := make([]float32, rows*R), make([]float32, len(predIDs)*R), make([]float32, len(succIDs)*R)
	for _, t := range []struct {
		buf kernels.Buffer
		dst []float32
	}{{projBuf, proj}, {predBuf, pred}, {succBuf, succ}} {
		if err := d.b.DownloadF32(t.buf, 0, t.dst); err != nil {
			return nil, err
		}
	}
	// Codebook rows are gathered level by level: level l's candidates are
	// successor rows from succStart, and its predecessors predecessor row 0
	// (the anchor) at level 0, else level l−1's candidates from 1+succStart[l-1].
	succStart := 0
	for l, tokens := range lattice.Tokens {
		firstPred, preds := 0, 1
		if l > 0 {
			preds = len(lattice.Tokens[l-1])
			firstPred = 1 + succStart - preds
		}
		h := proj[l*R : (l+1)*R]
		rowsOut := make([][]float64, preds)
		for p := range rowsOut {
			a := pred[(firstPred+p)*R : (firstPred+p+1)*R]
			rowsOut[p] = make([]float64, len(tokens))
			for ci := range tokens {
				b := succ[(succStart+ci)*R : (succStart+ci+1)*R]
				var dot float64
				for r := range R {
					dot += float64(a[r]) * float64(h[r]) * float64(b[r])
				}
				rowsOut[p][ci] = unary[l][ci] + dot
			}
		}
		succStart += len(tokens)
		lattice.Scores = append(lattice.Scores, rowsOut)
	}
	return lattice, nil
}

// v2Session is a DFlash2 drafter's session: a DFlash session whose drafts
// also leave the selector's lattice.
type v2Session struct {
	*Session
}

// Lattice is the latest Draft's candidate lattice.
func (s v2Session) Lattice() *ddtree.Lattice { return s.lattice }
