//go:build !cgo

package cuda

import (
	"errors"

	"ddflash/kernels"
)

// New needs cgo to load the CUDA driver.
func New(device int) (kernels.Backend, error) {
	return nil, errors.New("cuda: built without cgo (CGO_ENABLED=0), so the CUDA backend is unavailable")
}
