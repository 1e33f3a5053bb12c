//go:build cgo

package cuda

/*
#include <stdlib.h>
#include "driver.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"ddflash/kernels"
)

// ncclLibrary is the NCCL 2 library tensor parallelism loads, unless
// $DDFLASH_LIBNCCL names another (the tests' CPU emulation).
const ncclLibrary = "libnccl.so.2"

// ncclMinVersion is NCCL 2.9.0, the first release whose collectives can be
// captured in CUDA graphs (the engine's replayable steps will need that).
const ncclMinVersion = 20900

// Connect implements kernels.Connector: one NCCL communicator per rank,
// made together by ncclCommInitAll (one process drives every GPU, so no
// unique id has to travel between processes). Without NCCL it fails,
// naming the library: tensor parallelism over GPUs does not fall back to
// copies through host memory.
func (be *Backend) Connect(ranks []kernels.Backend) (kernels.Comm, error) {
	gpus := make([]*Backend, len(ranks))
	devices := make([]C.int, len(ranks))
	for i, r := range ranks {
		g, ok := r.(*Backend)
		if !ok {
			return nil, fmt.Errorf("cuda: rank %d runs on %s: NCCL connects CUDA ranks only", i, r.Name())
		}
		gpus[i], devices[i] = g, C.int(g.ordinal)
	}
	if err := openNCCL(); err != nil {
		return nil, err
	}
	comms := make([]C.ncclComm_t, len(ranks))
	if err := ncclCheck("ncclCommInitAll", C.dd_nccl_init_all(gpus[0].ctx, &comms[0], C.int(len(ranks)), &devices[0])); err != nil {
		return nil, err
	}
	return &ncclComm{ranks: gpus, comms: comms}, nil
}

// openNCCL loads NCCL and checks its version.
func openNCCL() error {
	path := os.Getenv("DDFLASH_LIBNCCL")
	if path == "" {
		path = ncclLibrary
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	libMu.Lock()
	r := C.dd_nccl_open(cpath, &msg[0], C.size_t(len(msg)))
	libMu.Unlock()
	if r != 0 {
		return fmt.Errorf("cuda: tensor parallelism over GPUs needs NCCL (%s; install NCCL 2, e.g. Debian's libnccl2, or add its folder to LD_LIBRARY_PATH), and does not fall back to copies through host memory: %s",
			ncclLibrary, C.GoString(&msg[0]))
	}
	var version C.int
	if err := ncclCheck("ncclGetVersion", C.dd_nccl_version(&version)); err != nil {
		return err
	}
	if version < ncclMinVersion {
		// Before 2.9 the code was major*1000 + minor*100 + patch.
		v := int(version)
		return fmt.Errorf("cuda: %s is NCCL %d.%d.%d; tensor parallelism needs 2.9 or newer (collectives captured in CUDA graphs)", path, v/1000, v%1000/100, v%100)
	}
	return nil
}

func ncclCheck(op string, r C.ncclResult_t) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %s: %s (ncclResult_t %d)", op, C.GoString(C.dd_nccl_error_string(r)), int(r))
}

// ncclComm is a kernels.Comm over NCCL. Each collective is enqueued on the
// rank's stream after the ops queued before it, and ops queued after it see
// its result: no host copy and no wait for the GPU. Being stream-ordered,
// the collectives can be captured in CUDA graphs with the rest of a step
// (NCCL 2.9+). A collective's arguments are the same on every rank, so an
// argument NCCL rejects fails every rank alike.
type ncclComm struct {
	ranks []*Backend
	comms []C.ncclComm_t
}

func (c *ncclComm) Size() int { return len(c.ranks) }

// enqueue runs call with rank's backend locked, so the collective takes its
// place among the rank's ops in call order.
func (c *ncclComm) enqueue(rank int, op string, call func(be *Backend) C.ncclResult_t) error {
	be := c.ranks[rank]
	be.mu.Lock()
	defer be.mu.Unlock()
	return ncclCheck(op, call(be))
}

// AllReduceSum implements kernels.Comm (in place, F32).
func (c *ncclComm) AllReduceSum(rank int, buf kernels.Buffer, n int) error {
	b := f32s("AllReduceSum", buf, n)
	return c.enqueue(rank, "ncclAllReduce", func(be *Backend) C.ncclResult_t {
		return C.dd_nccl_all_reduce_sum(be.ctx, c.comms[rank], C.CUdeviceptr(b.addr()), C.size_t(n), be.stream)
	})
}

// AllGather implements kernels.Comm (F32).
func (c *ncclComm) AllGather(rank int, dst, src kernels.Buffer, n int) error {
	d, s := f32s("AllGather dst", dst, n*len(c.ranks)), f32s("AllGather src", src, n)
	return c.enqueue(rank, "ncclAllGather", func(be *Backend) C.ncclResult_t {
		return C.dd_nccl_all_gather(be.ctx, c.comms[rank], C.CUdeviceptr(d.addr()), C.CUdeviceptr(s.addr()), C.size_t(n), be.stream)
	})
}

// Broadcast implements kernels.Comm (in place, F32).
func (c *ncclComm) Broadcast(rank, root int, buf kernels.Buffer, n int) error {
	b := f32s("Broadcast", buf, n)
	return c.enqueue(rank, "ncclBroadcast", func(be *Backend) C.ncclResult_t {
		return C.dd_nccl_broadcast(be.ctx, c.comms[rank], C.CUdeviceptr(b.addr()), C.size_t(n), C.int(root), be.stream)
	})
}

// Close waits for each rank's queued ops, then destroys its communicator,
// every rank from its own goroutine as the collectives run (NCCL may flush
// work between peers while it tears a communicator down). Like Backend.Close
// it has no one to report a failure to.
func (c *ncclComm) Close() {
	var wg sync.WaitGroup
	for i, be := range c.ranks {
		wg.Go(func() {
			be.Sync()
			C.dd_nccl_destroy(c.comms[i])
		})
	}
	wg.Wait()
}
