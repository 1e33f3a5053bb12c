//go:build cgo

package cuda

/*
#include "driver.h"
*/
import "C"

import (
	"fmt"
	"strings"
)

// Function attributes (CUfunction_attribute) and the device attribute the
// occupancy is a fraction of (CUdevice_attribute), from the CUDA driver API.
const (
	funcMaxThreadsPerBlock = 0
	funcSharedSizeBytes    = 1
	funcLocalSizeBytes     = 3
	funcNumRegs            = 4
	attrMaxThreadsPerSM    = 39
)

// kernelResource is what the driver reports for one kernel as compiled for
// this GPU, and its occupancy at the block size of its latest launch.
type kernelResource struct {
	name                 string
	regs, localBytes     int // per thread; local memory above 0 means spills (or local arrays)
	sharedBytes          int // static shared memory per block
	maxThreads           int // the most threads per block it can launch with
	block, dynamicShared int // its latest launch; block 0: not launched by this backend
	blocksPerSM          int
	occupancy            float64 // resident threads / the multiprocessor's maximum
}

// kernelResources reports every kernel of the embedded PTX (the driver
// compiles each for this GPU at load, so registers and local memory are
// the real ones).
func (be *Backend) kernelResources() ([]kernelResource, error) {
	be.mu.Lock()
	defer be.mu.Unlock()
	var perSM C.int
	if err := check("cuDeviceGetAttribute", C.dd_device_attr(be.dev, attrMaxThreadsPerSM, &perSM)); err != nil {
		return nil, err
	}
	var out []kernelResource
	for _, name := range KernelNames() {
		k := be.fn(name)
		r := kernelResource{name: name, block: k.block, dynamicShared: k.smem}
		for _, a := range []struct {
			attr int
			v    *int
		}{{funcNumRegs, &r.regs}, {funcLocalSizeBytes, &r.localBytes}, {funcSharedSizeBytes, &r.sharedBytes}, {funcMaxThreadsPerBlock, &r.maxThreads}} {
			var v C.int
			if err := check("cuFuncGetAttribute("+name+")", C.dd_func_attr(be.ctx, k.f, C.int(a.attr), &v)); err != nil {
				return nil, err
			}
			*a.v = int(v)
		}
		if r.block > 0 {
			var blocks C.int
			op := fmt.Sprintf("cuOccupancyMaxActiveBlocksPerMultiprocessor(%s, %d threads)", name, r.block)
			if err := check(op, C.dd_occupancy(be.ctx, k.f, C.int(r.block), C.size_t(r.dynamicShared), &blocks)); err != nil {
				return nil, err
			}
			r.blocksPerSM = int(blocks)
			r.occupancy = float64(r.blocksPerSM*r.block) / float64(perSM)
		}
		out = append(out, r)
	}
	return out, nil
}

// resourceReport is the kernel table with cuBLASLt's version and the GEMM
// shapes it had no algorithm for.
func (be *Backend) resourceReport(rs []kernelResource) string {
	var s strings.Builder
	fmt.Fprintf(&s, "kernels on %s\n", be.Name())
	if be.blas == nil {
		fmt.Fprintf(&s, "cuBLASLt: not loaded (%v)\n", be.blasErr)
	} else {
		fmt.Fprintf(&s, "cuBLASLt %s; heuristic misses: %d\n", be.blas.version(), len(be.blas.misses))
		for _, m := range be.blas.misses {
			fmt.Fprintf(&s, "  no algorithm: %s\n", m)
		}
	}
	fmt.Fprintf(&s, "%-28s %5s %7s %7s %6s %6s %7s %6s %6s\n", "kernel", "regs", "local B", "smem B", "max", "block", "dyn B", "blk/SM", "occ")
	for _, r := range rs {
		launch := fmt.Sprintf("%6s %7s %6s %6s", "-", "-", "-", "-") // not launched here
		if r.block > 0 {
			launch = fmt.Sprintf("%6d %7d %6d %5.0f%%", r.block, r.dynamicShared, r.blocksPerSM, 100*r.occupancy)
		}
		fmt.Fprintf(&s, "%-28s %5d %7d %7d %6d %s\n", r.name, r.regs, r.localBytes, r.sharedBytes, r.maxThreads, launch)
	}
	return s.String()
}
