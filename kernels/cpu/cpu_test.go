package cpu

import (
	"fmt"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/kerneltest"
)

// TestConformance runs the suite serially and on three workers that split
// every op however small, with the portable kernels, and with the SIMD ones
// when this build and CPU have them.
func TestConformance(t *testing.T) {
	variants := []kernelSet{portableKernels}
	if simd, ok := simdKernels(); ok {
		variants = append(variants, simd)
	} else {
		t.Log("no SIMD kernels in this build or on this CPU: testing the portable ones only")
	}
	for _, kern := range variants {
		for _, threads := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/threads=%d", kern.name, threads), func(t *testing.T) {
				kerneltest.Run(t, func() kernels.Backend { return newBackend(threads, kern, 1) })
			})
		}
	}
}
