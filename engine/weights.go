package engine

import (
	"ddflash/engine/config"
	"ddflash/kernels"
)

// LayerWeights holds one decoder layer's tensors on the backend. Matrices keep
// the checkpoint dtype ([out, in]; FP8 ones as *kernels.BlockScaled); norm
// weights, the conv kernel, A_log and dt_bias are F32.
type LayerWeights struct {
	Kind config.LayerKind

	InputNorm kernels.Buffer // [hidden], (1+w)
	PostNorm  kernels.Buffer // [hidden], (1+w)
	Gate      kernels.Buffer // [intermediate, hidden]
	Up        kernels.Buffer // [intermediate, hidden]
	Down      kernels.Buffer // [hidden, intermediate]

	// Full attention (Kind == config.Full).
	QProj kernels.Buffer // [heads*headDim*2, hidden]: per head [query | gate]
	KProj kernels.Buffer // [kvHeads*headDim, hidden]
	VProj kernels.Buffer // [kvHeads*headDim, hidden]
	OProj kernels.Buffer // [hidden, heads*headDim]
	QNorm kernels.Buffer // [headDim], (1+w)
	KNorm kernels.Buffer // [headDim], (1+w)

	// Gated DeltaNet (Kind == config.Linear).
	InProjQKV kernels.Buffer // [convDim, hidden]: q | k | v
	InProjZ   kernels.Buffer // [valueDim, hidden]
	InProjB   kernels.Buffer // [valueHeads, hidden]
	InProjA   kernels.Buffer // [valueHeads, hidden]
	Conv      kernels.Buffer // [convDim, kernel] F32
	DtBias    kernels.Buffer // [valueHeads] F32
	ALog      kernels.Buffer // [valueHeads] F32
	Norm      kernels.Buffer // [valueDim/valueHeads] F32, plain weight
	OutProj   kernels.Buffer // [hidden, valueDim]
}

// Weights is the whole text model on a backend.
type Weights struct {
	Embed     kernels.Buffer // [vocab, hidden]
	FinalNorm kernels.Buffer // [hidden], (1+w)
	LMHead    kernels.Buffer // [vocab, hidden]; the embedding when tied
	Layers    []LayerWeights
}

// Free releases every buffer of the weights on b (a tied LM head once).
func (w *Weights) Free(b kernels.Backend) {
	bufs := []*kernels.Buffer{&w.Embed, &w.FinalNorm, &w.LMHead}
	for i := range w.Layers {
		l := &w.Layers[i]
		bufs = append(bufs, &l.InputNorm, &l.PostNorm, &l.Gate, &l.Up, &l.Down,
			&l.QProj, &l.KProj, &l.VProj, &l.OProj, &l.QNorm, &l.KNorm,
			&l.InProjQKV, &l.InProjZ, &l.InProjB, &l.InProjA, &l.Conv, &l.DtBias, &l.ALog, &l.Norm, &l.OutProj)
	}
	freed := map[kernels.Buffer]bool{}
	for _, buf := range bufs {
		if *buf != nil && !freed[*buf] {
			freed[*buf] = true
			b.Free(*buf)
		}
		*buf = nil
	}
}
