package dflash

import (
	"fmt"
	"math"

	"ddflash/ddtree"
	"ddflash/engine"
	"ddflash/kernels"
)

// This file holds what a DFlash2 drafter adds to DFlash (docs/dflash2.md):
// a grouped dynamic convolution around every attention and MLP sublayer
// (the backend's GroupedConv), and the candidate selector that turns the
// proposal logits into a lattice. The selector's matrix products and
// codebook gathers run on the backend, its top-K and its K² scores of rank
// R per position (small) on the host.

// convWeights is one grouped dynamic convolution: static taps for its two
// sides (the sublayer's input and output) and the projection that makes
// both sides' per-group dynamic taps from the sublayer's input.
type convWeights struct {
	Base       kernels.Buffer // [2, taps, hidden] F32
	Projection kernels.Buffer // [2·taps·groups, hidden]
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

// convScratch is a draft step's room for the convolutions: the dynamic
// taps of the sublayer in flight ([rows, 2, taps, groups]) and a
// convolution's output.
type convScratch struct {
	delta, out kernels.Buffer
}

// convIn convolves a sublayer's input u (rows of the block) with side 0,
// keeps the dynamic taps of both sides for convOut, and returns the
// buffer holding the result. A DFlash drafter has no convolutions: u
// itself.
func (d *Drafter) convIn(w *convWeights, s *convScratch, u kernels.Buffer, rows int) kernels.Buffer {
	c := d.Cfg
	if c.V2 == nil {
		return u
	}
	d.b.MatMul(s.delta, u, w.Projection, rows, 2*c.V2.ConvKernelSize*c.ConvGroups(), c.HiddenSize)
	return d.convolve(w, s, u, 0, rows)
}

// convOut convolves a sublayer's output y with side 1 and the dynamic taps
// convIn made from the sublayer's input; y itself for DFlash.
func (d *Drafter) convOut(w *convWeights, s *convScratch, y kernels.Buffer, rows int) kernels.Buffer {
	if d.Cfg.V2 == nil {
		return y
	}
	return d.convolve(w, s, y, 1, rows)
}

func (d *Drafter) convolve(w *convWeights, s *convScratch, x kernels.Buffer, side, rows int) kernels.Buffer {
	c, H := d.Cfg, d.Cfg.HiddenSize
	taps, groups := c.V2.ConvKernelSize, c.ConvGroups()
	stride := 2 * taps * groups
	base := d.b.Slice(w.Base, side*taps*H, taps*H)
	delta := d.b.Slice(s.delta, side*taps*groups, rows*stride-side*taps*groups)
	d.b.GroupedConv(s.out, x, base, delta, rows, H, taps, c.V2.ConvGroupSize, stride)
	return s.out
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
