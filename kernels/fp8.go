package kernels

import "fmt"

// FP8Block is the edge of the square weight blocks that share one scale in
// FP8 checkpoints (quantization_config.weight_block_size [128, 128]).
const FP8Block = 128

// BlockScaled is an FP8 weight matrix [Rows, Cols] as FP8 checkpoints store
// it: Q holds the E4M3 values, Scale one F32 factor per 128×128 block,
// [ceil(Rows/128), ceil(Cols/128)] row-major, and the weight is
// w[i][j] = Q[i][j] · Scale[i/128][j/128]. MatMul widens Q in registers; no
// dequantised copy exists. Both buffers belong to one backend.
type BlockScaled struct {
	Q, Scale   Buffer
	Rows, Cols int
}

// ScaleBlocks is the shape of the scale grid of a [rows, cols] matrix.
func ScaleBlocks(rows, cols int) (int, int) {
	return (rows + FP8Block - 1) / FP8Block, (cols + FP8Block - 1) / FP8Block
}

// NewBlockScaled checks the buffers against the matrix shape.
func NewBlockScaled(q, scale Buffer, rows, cols int) (*BlockScaled, error) {
	br, bc := ScaleBlocks(rows, cols)
	switch {
	case q.DType() != F8E4M3 || q.Len() != rows*cols:
		return nil, fmt.Errorf("fp8 weight [%d, %d]: values are %d %v elements, want %d F8E4M3", rows, cols, q.Len(), q.DType(), rows*cols)
	case scale.DType() != F32 || scale.Len() != br*bc:
		return nil, fmt.Errorf("fp8 weight [%d, %d]: scales are %d %v elements, want %d F32 ([%d, %d])", rows, cols, scale.Len(), scale.DType(), br*bc, br, bc)
	}
	return &BlockScaled{Q: q, Scale: scale, Rows: rows, Cols: cols}, nil
}

// DType reports F8E4M3.
func (w *BlockScaled) DType() DType { return F8E4M3 }

// Len is the number of weight elements.
func (w *BlockScaled) Len() int { return w.Rows * w.Cols }
