// Package device opens a compute backend by name, for the commands'
// --device flag.
package device

import (
	"fmt"
	"strconv"
	"strings"

	"ddflash/kernels"
	"ddflash/kernels/cpu"
	"ddflash/kernels/cuda"
)

// Names lists the backends Open accepts ("cuda:N" picks GPU N).
var Names = []string{"cpu", "cuda"}

// Open returns the backend called name: "cpu" (all cores), "cuda" (GPU 0)
// or "cuda:N". A CUDA backend that cannot start says why (no driver, no
// cuBLASLt, an old GPU).
func Open(name string) (kernels.Backend, error) {
	kind, index, hasIndex := strings.Cut(strings.ToLower(strings.TrimSpace(name)), ":")
	switch {
	case kind == "cpu" && !hasIndex:
		return cpu.New(0), nil
	case kind == "cuda":
		gpu := 0
		if hasIndex {
			n, err := strconv.Atoi(index)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("device %q: want cuda:N with a GPU index N >= 0", name)
			}
			gpu = n
		}
		return cuda.New(gpu)
	}
	return nil, fmt.Errorf("unknown device %q: use %s (or cuda:N)", name, strings.Join(Names, " or "))
}
