//go:build cgo

package cuda

/*
#include "driver.h"
*/
import "C"

import "fmt"

// Counts is the work a backend has asked of the driver: what a step costs
// in launches, allocations and host round trips, apart from the kernels'
// own time. Take the difference of two readings around a step.
type Counts struct {
	// Launches counts kernel launches, cuBLASLt matmuls and graph launches:
	// a replayed graph counts once, whatever it holds.
	Launches      int64
	Allocs        int64 // cuMemAlloc calls (buffers and scratch)
	Uploads       int64 // host→device copies
	UploadBytes   int64
	Downloads     int64 // device→host copies, each waiting for the stream
	DownloadBytes int64
}

// Sub is c − d, the work between two readings.
func (c Counts) Sub(d Counts) Counts {
	return Counts{c.Launches - d.Launches, c.Allocs - d.Allocs, c.Uploads - d.Uploads, c.UploadBytes - d.UploadBytes,
		c.Downloads - d.Downloads, c.DownloadBytes - d.DownloadBytes}
}

func (c Counts) String() string {
	return fmt.Sprintf("%d launches, %d allocations, %d uploads (%d B), %d synchronising downloads (%d B)",
		c.Launches, c.Allocs, c.Uploads, c.UploadBytes, c.Downloads, c.DownloadBytes)
}

// Counts is what this backend has asked of the driver since New (its own
// tally, on a GPU as on the emulation).
func (be *Backend) Counts() Counts {
	be.mu.Lock()
	defer be.mu.Unlock()
	return be.counts
}

// EmulatorCounts reads the CPU emulation's own counters, summed over every
// backend of the process; ok is false when the driver is not the emulation.
// The tests hold the backend's tally (Counts) to them.
func EmulatorCounts() (c Counts, ok bool) {
	var raw [C.DD_EMU_COUNTS]C.uint64_t
	if C.dd_emu_counts(&raw[0]) != 0 {
		return Counts{}, false
	}
	// Mirrors emu/driver.cc's EmuCounts: launches, graph launches, cuBLASLt
	// matmuls, allocations, uploads, their bytes, downloads, their bytes.
	v := func(i int) int64 { return int64(raw[i]) }
	return Counts{Launches: v(0) + v(1) + v(2), Allocs: v(3), Uploads: v(4), UploadBytes: v(5), Downloads: v(6), DownloadBytes: v(7)}, true
}
