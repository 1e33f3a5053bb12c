//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "driver.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"ddflash/kernels"
)

// Device attributes (CUdevice_attribute).
const (
	attrMultiprocessors = 16
	attrCCMajor         = 75
	attrCCMinor         = 76
)

// Backend runs ops on one GPU. Its methods may be called from any
// goroutine; a mutex serialises them, and they run in call order.
type Backend struct {
	mu      sync.Mutex
	ordinal int // the device's index, as New was given it (and NCCL takes it)
	dev     C.CUdevice
	ctx     C.CUcontext
	stream  C.CUstream
	name    string
	cc      int // compute capability, e.g. 90
	sms     int // multiprocessors

	modules []C.CUmodule
	funcs   map[string]*kernelFn
	args    argPacker

	blas    *blas // nil when cuBLASLt is missing: MatMul then always uses its own kernel
	blasErr error // why blas is nil

	freed      []allocation // Freed buffers, released once the stream has caught up
	live       int64        // bytes of Alloc'd buffers not yet released
	scratch    allocation   // grow-only device memory for ops' temporaries
	retired    []allocation // outgrown scratch that live graphs may still use
	graphs     int          // graphs not yet closed
	attnTable  allocation   // Attention's descriptor table (attnTableBuffer)
	capturing  bool
	asyncError error                // the first failure of an op, reported by Sync
	counts     kernels.DriverCounts // the driver calls made (counts.go)
}

var _ kernels.Backend = (*Backend)(nil)

// New opens GPU device (0 for the first) and loads the kernels. Without an
// NVIDIA driver it returns an error naming the missing library.
func New(device int) (kernels.Backend, error) {
	be, err := open(device)
	if err != nil {
		return nil, err
	}
	return be, nil
}

// libMu serialises loading the libraries (dd_cuda_open, dd_lt_open).
var libMu sync.Mutex

func open(device int) (*Backend, error) {
	var msg [512]C.char
	libMu.Lock()
	r := C.dd_cuda_open(&msg[0], C.size_t(len(msg)))
	libMu.Unlock()
	if r != 0 {
		return nil, fmt.Errorf("cuda: %s", C.GoString(&msg[0]))
	}
	if err := check("cuInit", C.dd_init()); err != nil {
		return nil, err
	}
	be := &Backend{ordinal: device, funcs: map[string]*kernelFn{}}
	if err := check(fmt.Sprintf("device %d", device), C.dd_device(C.int(device), &be.dev)); err != nil {
		return nil, err
	}
	var major, minor, sms C.int
	var name [256]C.char
	for _, q := range []struct {
		attr int
		v    *C.int
	}{{attrCCMajor, &major}, {attrCCMinor, &minor}, {attrMultiprocessors, &sms}} {
		if err := check("cuDeviceGetAttribute", C.dd_device_attr(be.dev, C.int(q.attr), q.v)); err != nil {
			return nil, err
		}
	}
	if err := check("cuDeviceGetName", C.dd_device_name(be.dev, &name[0], C.int(len(name)))); err != nil {
		return nil, err
	}
	be.cc, be.sms, be.name = int(major)*10+int(minor), int(sms), C.GoString(&name[0])
	if be.cc < 80 {
		return nil, fmt.Errorf("cuda: %s has compute capability %d.%d; the kernels need 8.0 (Ampere) or newer", be.name, major, minor)
	}
	if err := check("cuDevicePrimaryCtxRetain", C.dd_ctx_retain(be.dev, &be.ctx)); err != nil {
		return nil, err
	}
	if err := check("cuStreamCreate", C.dd_stream_create(be.ctx, &be.stream)); err != nil {
		be.Close()
		return nil, err
	}
	if err := be.loadModules(); err != nil {
		be.Close()
		return nil, err
	}
	be.blas, be.blasErr = newBlas(be)
	return be, nil
}

// ptxArch picks the embedded PTX for a compute capability: the newest
// target not above it (the driver compiles PTX for newer GPUs too).
func ptxArch(cc int) string {
	switch {
	case cc >= 90:
		return "sm_90"
	case cc >= 89:
		return "sm_89" // Ada: the hardware E4M3 conversion
	}
	return "sm_80"
}

// loadModules JIT-compiles every embedded PTX module for this GPU.
func (be *Backend) loadModules() error {
	dir := "ptx/" + ptxArch(be.cc)
	entries, err := ptxFS.ReadDir(dir)
	if err != nil || len(entries) == 0 {
		return fmt.Errorf("cuda: no embedded PTX in %s (run make cuda)", dir)
	}
	for _, e := range entries {
		src, err := ptxFS.ReadFile(dir + "/" + e.Name())
		if err != nil {
			return err
		}
		text := C.CString(string(src))
		var log [4096]C.char
		var mod C.CUmodule
		r := C.dd_module_load(be.ctx, &mod, text, &log[0], C.size_t(len(log)))
		C.free(unsafe.Pointer(text))
		if err := check("loading "+dir+"/"+e.Name(), r); err != nil {
			return fmt.Errorf("%w\n%s", err, C.GoString(&log[0]))
		}
		be.modules = append(be.modules, mod)
	}
	return nil
}

// Name describes the GPU, and says so when cuBLASLt is missing.
func (be *Backend) Name() string {
	if be.blasErr != nil {
		return fmt.Sprintf("cuda(%s, sm_%d, %d SMs; no cuBLASLt: %v)", be.name, be.cc, be.sms, be.blasErr)
	}
	return fmt.Sprintf("cuda(%s, sm_%d, %d SMs)", be.name, be.cc, be.sms)
}

// Close releases the stream and the device context; buffers become invalid.
func (be *Backend) Close() {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.blas != nil {
		be.blas.close()
		be.blas = nil
	}
	if be.stream != nil {
		C.dd_stream_sync(be.ctx, be.stream)
	}
	be.releaseFreed(nil)
	be.scratch.free(be)
	be.attnTable.free(be)
	for i := range be.retired {
		be.retired[i].free(be)
	}
	if be.stream != nil {
		C.dd_stream_destroy(be.ctx, be.stream)
		be.stream = nil
	}
	if be.ctx != nil {
		C.dd_ctx_release(be.dev)
		be.ctx = nil
	}
}

// cudaError is a failed driver call.
type cudaError struct {
	op   string
	code C.CUresult
}

func (e *cudaError) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%s)", e.op, C.GoString(C.dd_error_name(e.code)), C.GoString(C.dd_error_string(e.code)))
}

func check(op string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &cudaError{op, r}
}

// fail records the first asynchronous failure; Sync and the downloads return it.
func (be *Backend) fail(err error) {
	if err != nil && be.asyncError == nil {
		be.asyncError = err
	}
}

// Sync waits for every queued op and reports the first failure since the last Sync.
func (be *Backend) Sync() error {
	be.mu.Lock()
	defer be.mu.Unlock()
	return be.syncLocked()
}

func (be *Backend) syncLocked() error {
	err := be.asyncError
	be.asyncError = nil
	if err != nil {
		return err
	}
	err = check("cuStreamSynchronize", C.dd_stream_sync(be.ctx, be.stream))
	be.releaseFreed(err)
	return err
}

// releaseFreed returns Freed buffers' memory after a successful wait for
// the stream (syncErr nil), when no queued op can use them any more.
func (be *Backend) releaseFreed(syncErr error) {
	if syncErr != nil {
		return
	}
	for i := range be.freed {
		be.live -= int64(be.freed[i].bytes)
		be.freed[i].free(be)
	}
	be.freed = be.freed[:0]
}

// BufferBytes is the device memory held by buffers made by Alloc: Freed
// ones count until the next Sync releases them. (Ops' scratch is not
// included: the backend keeps it for its lifetime.)
func (be *Backend) BufferBytes() int64 {
	be.mu.Lock()
	defer be.mu.Unlock()
	return be.live
}

// kernelFn is a loaded kernel with the shape of its latest launch (for the
// resource report: occupancy depends on the block size).
type kernelFn struct {
	f           C.CUfunction
	block, smem int // threads per block and dynamic shared memory; 0: never launched
}

// fn returns a kernel by name, looking through the modules once.
func (be *Backend) fn(name string) *kernelFn {
	if k, ok := be.funcs[name]; ok {
		return k
	}
	if len(be.modules) == 0 {
		panic("cuda: kernels not loaded")
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	for _, m := range be.modules {
		var f C.CUfunction
		if C.dd_module_function(be.ctx, &f, m, cname) == 0 {
			k := &kernelFn{f: f}
			be.funcs[name] = k
			return k
		}
	}
	panic(fmt.Sprintf("cuda: no kernel %q in the embedded PTX (run make cuda)", name))
}

// dim3 is a grid or block shape.
type dim3 struct{ x, y, z int }

func d1(x int) dim3 { return dim3{x, 1, 1} }

// launch queues kernel name with the given arguments (see argPacker.pack).
// The caller holds be.mu.
func (be *Backend) launch(name string, grid, block dim3, smem int, args ...any) {
	if grid.x <= 0 || grid.y <= 0 || grid.z <= 0 {
		return // nothing to do
	}
	checkArgs(name, args)
	k := be.fn(name)
	k.block, k.smem = block.x*block.y*block.z, smem
	params := be.args.pack(args)
	if !be.capturing {
		be.counts.Launches++
	}
	r := C.dd_launch(be.ctx, k.f, C.uint(grid.x), C.uint(grid.y), C.uint(grid.z), C.uint(block.x), C.uint(block.y),
		C.uint(block.z), C.uint(smem), be.stream, params)
	be.fail(check("launching "+name, r))
}

// gridFor sizes a grid-stride launch over n elements with blocks of threads.
func (be *Backend) gridFor(n, threads int) dim3 {
	return d1(min((n+threads-1)/threads, 32*be.sms))
}

// allocation is a device memory block.
type allocation struct {
	ptr   C.CUdeviceptr
	bytes int
}

func (a *allocation) free(be *Backend) {
	if a.ptr != 0 {
		C.dd_mem_free(be.ctx, a.ptr)
	}
	*a = allocation{}
}

// scratchPtr returns at least bytes of device scratch memory, valid until
// the next op that asks for scratch (ops run in stream order, so one op's
// temporaries never overlap another's). It grows only outside a capture.
func (be *Backend) scratchPtr(bytes int) (devPtr, error) {
	if bytes <= be.scratch.bytes {
		return devPtr(be.scratch.ptr), nil
	}
	if be.capturing {
		return 0, fmt.Errorf("cuda: an op needs %d bytes of scratch during graph capture; run the step once before capturing it", bytes)
	}
	if err := check("cuStreamSynchronize", C.dd_stream_sync(be.ctx, be.stream)); err != nil {
		return 0, err
	}
	be.releaseFreed(nil)
	if be.graphs > 0 { // a graph may hold the old scratch's address: keep it until the graphs close
		be.retired = append(be.retired, be.scratch)
	} else {
		be.scratch.free(be)
	}
	size := max(bytes, 1<<20)
	size += size / 2
	be.counts.Allocs++
	var p C.CUdeviceptr
	if err := check(fmt.Sprintf("cuMemAlloc(%d) for scratch", size), C.dd_mem_alloc(be.ctx, &p, C.size_t(size))); err != nil {
		return 0, err
	}
	be.scratch = allocation{p, size}
	return devPtr(p), nil
}

// errCapture is returned by calls that cannot be part of a graph.
var errCapture = errors.New("cuda: allocations and host transfers cannot be captured in a graph; do them before BeginCapture")

var _ kernels.Replayer = (*Backend)(nil)
