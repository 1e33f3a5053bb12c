//go:build !cgo

package bench

import "errors"

// NVML needs cgo; this build records why it has no GPU telemetry.
func NVML() GPUReader { return noNVML{} }

type noNVML struct{}

var errNoCgo = errors.New("no GPU telemetry: built without cgo, so NVML is unavailable")

func (noNVML) Info() (GPUSet, error)       { return GPUSet{}, errNoCgo }
func (noNVML) States() ([]GPUState, error) { return nil, errNoCgo }
