package safetensors

import (
	"ddflash/internal/half"
	"encoding/binary"
	"fmt"
	"math"
)

// Float32s decodes the tensor's data to float32.
func (t Tensor) Float32s() ([]float32, error) {
	size := DTypeSize(t.DType)
	if size == 0 {
		return nil, fmt.Errorf("tensor %s: unsupported dtype %q", t.Name, t.DType)
	}
	out := make([]float32, len(t.Data)/size)
	for i := range out {
		switch t.DType {
		case "F32":
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		case "BF16":
			out[i] = half.BF16ToFloat32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		case "F16":
			out[i] = half.F16ToFloat32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		case "F8_E4M3":
			out[i] = half.E4M3ToFloat32(t.Data[i])
		}
	}
	return out, nil
}

// Encode stores values in dtype (F32, BF16, F16 or F8_E4M3), rounding to
// nearest even (F8_E4M3 saturates at ±448).
func Encode(dtype string, values []float32) ([]byte, error) {
	size := DTypeSize(dtype)
	if size == 0 {
		return nil, fmt.Errorf("encode: unsupported dtype %q (want F32, BF16, F16 or F8_E4M3)", dtype)
	}
	out := make([]byte, size*len(values))
	for i, v := range values {
		switch dtype {
		case "F32":
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		case "BF16":
			binary.LittleEndian.PutUint16(out[2*i:], half.Float32ToBF16(v))
		case "F16":
			binary.LittleEndian.PutUint16(out[2*i:], half.Float32ToF16(v))
		case "F8_E4M3":
			out[i] = half.Float32ToE4M3(v)
		}
	}
	return out, nil
}
