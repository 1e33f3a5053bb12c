package cpu

import (
	"ddflash/internal/half"
	"ddflash/kernels"
)

// widenInto converts BF16 or F16 bit patterns to float32.
func widenInto(dst []float32, src []uint16, dt kernels.DType) {
	src = src[:len(dst)]
	if dt == kernels.BF16 {
		for i, h := range src {
			dst[i] = half.BF16ToFloat32(h)
		}
		return
	}
	for i, h := range src {
		dst[i] = half.F16ToFloat32(h)
	}
}
