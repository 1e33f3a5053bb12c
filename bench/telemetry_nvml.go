//go:build cgo

package bench

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML reads the GPUs through the NVIDIA driver's library; without a driver
// every call fails softly with an error the record keeps as a note.
func NVML() GPUReader { return nvmlReader{} }

type nvmlReader struct{}

// each runs f on every device inside one NVML session.
func (nvmlReader) each(f func(i int, d nvml.Device) error) error {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("no GPU telemetry: NVML: %v", ret)
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("no GPU telemetry: NVML device count: %v", ret)
	}
	for i := range n {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("NVML: GPU %d: %v", i, ret)
		}
		if err := f(i, d); err != nil {
			return err
		}
	}
	return nil
}

func (r nvmlReader) Info() (GPUSet, error) {
	var s GPUSet
	err := r.each(func(i int, d nvml.Device) error {
		g := GPUInfo{Index: i}
		g.Name, _ = d.GetName()
		g.UUID, _ = d.GetUUID()
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryMiB = mem.Total >> 20
		}
		if s.Driver == "" {
			s.Driver, _ = nvml.SystemGetDriverVersion()
		}
		s.GPUs = append(s.GPUs, g)
		return nil
	})
	return s, err
}

// States reads each GPU; a reading the device does not support stays 0.
func (r nvmlReader) States() ([]GPUState, error) {
	var out []GPUState
	err := r.each(func(i int, d nvml.Device) error {
		g := GPUState{Index: i}
		g.SMClockMHz, _ = d.GetClockInfo(nvml.CLOCK_SM)
		g.MemClockMHz, _ = d.GetClockInfo(nvml.CLOCK_MEM)
		g.TemperatureC, _ = d.GetTemperature(nvml.TEMPERATURE_GPU)
		if mw, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
			g.PowerW = float64(mw) / 1000
		}
		if mw, ret := d.GetEnforcedPowerLimit(); ret == nvml.SUCCESS {
			g.PowerLimitW = float64(mw) / 1000
		}
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryUsedMiB = mem.Used >> 20
		}
		out = append(out, g)
		return nil
	})
	return out, err
}
