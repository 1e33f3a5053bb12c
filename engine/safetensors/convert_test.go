package safetensors

import (
	"testing"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	// Values exactly representable in every dtype survive Encode then Float32s.
	values := []float32{0, 1, -1.5, 0.25, 448, -0.0078125, 1.0 / 512}
	for _, dt := range []string{"F32", "BF16", "F16", "F8_E4M3"} {
		data, err := Encode(dt, values)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Tensor{Name: "x", DType: dt, Shape: []int{len(values)}, Data: data}.Float32s()
		if err != nil {
			t.Fatal(err)
		}
		for i := range values {
			if got[i] != values[i] {
				t.Errorf("%s: value %d: got %g, want %g", dt, i, got[i], values[i])
			}
		}
	}
	if _, err := Encode("F64", values); err == nil {
		t.Error("Encode accepted F64")
	}
}
