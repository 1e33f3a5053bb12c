//go:build cgo

package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Local reads GPU index's name and memory through NVML. Without an NVIDIA
// driver it returns an error and the caller falls back to --gpu or --gpu-mem.
func Local(index int) (Device, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("NVML: %v (no NVIDIA driver here? pass --gpu NAME or --gpu-mem SIZE)", ret)
	}
	defer nvml.Shutdown()
	dev, ret := nvml.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("NVML: GPU %d: %v", index, ret)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("NVML: GPU %d memory: %v", index, ret)
	}
	name, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		name = fmt.Sprintf("GPU %d", index)
	}
	return Device{Name: name, Total: int64(mem.Total), Free: int64(mem.Free)}, nil
}
