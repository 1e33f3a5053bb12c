//go:build !cgo

package gpu

import "errors"

// Local needs cgo for NVML; a build without it always falls back to --gpu or --gpu-mem.
func Local(int) (Device, error) {
	return Device{}, errors.New("built without cgo, so NVML is unavailable: pass --gpu NAME or --gpu-mem SIZE")
}
