//go:build cgo

package cuda

/*
#include "driver.h"
*/
import "C"

import "ddflash/kernels"

// Counts is what this backend has asked of the driver since New (its own
// tally, on a GPU as on the emulation).
func (be *Backend) Counts() kernels.DriverCounts {
	be.mu.Lock()
	defer be.mu.Unlock()
	return be.counts
}

// EmulatorCounts reads the CPU emulation's own counters, summed over every
// backend of the process; ok is false when the driver is not the emulation.
// The tests hold the backend's tally (Counts) to them.
func EmulatorCounts() (c kernels.DriverCounts, ok bool) {
	var raw [C.DD_EMU_COUNTS]C.uint64_t
	if C.dd_emu_counts(&raw[0]) != 0 {
		return kernels.DriverCounts{}, false
	}
	// Mirrors emu/driver.cc's EmuCounts: launches, graph launches, cuBLASLt
	// matmuls, allocations, uploads, their bytes, downloads, their bytes.
	v := func(i int) int64 { return int64(raw[i]) }
	return kernels.DriverCounts{Launches: v(0) + v(1) + v(2), Allocs: v(3), Uploads: v(4), UploadBytes: v(5), Downloads: v(6), DownloadBytes: v(7)}, true
}
