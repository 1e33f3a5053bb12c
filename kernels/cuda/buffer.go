//go:build cgo

package cuda

/*
#include "driver.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"ddflash/internal/half"
	"ddflash/kernels"
)

// buffer is n elements of dt at element off of a device allocation; a
// Slice view shares its parent's allocation.
type buffer struct {
	mem  *allocation // nil for an empty buffer
	off  int
	n    int
	dt   kernels.DType
	view bool // made by Slice
}

func (b *buffer) DType() kernels.DType { return b.dt }
func (b *buffer) Len() int             { return b.n }

// addr is the device address of the buffer's first element.
func (b *buffer) addr() devPtr {
	if b.mem == nil {
		return 0
	}
	return devPtr(b.mem.ptr) + devPtr(b.off*b.dt.Size())
}

// Alloc returns a zeroed buffer of n elements.
func (be *Backend) Alloc(dt kernels.DType, n int) (kernels.Buffer, error) {
	if n < 0 || dt > kernels.F8E4M3 {
		return nil, fmt.Errorf("cuda: alloc of %d %v elements: need n >= 0 and a known dtype", n, dt)
	}
	b := &buffer{n: n, dt: dt}
	if n == 0 {
		return b, nil
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.capturing {
		return nil, errCapture
	}
	bytes := n * dt.Size()
	be.counts.Allocs++
	var p C.CUdeviceptr
	if err := check(fmt.Sprintf("cuMemAlloc(%d bytes)", bytes), C.dd_mem_alloc(be.ctx, &p, C.size_t(bytes))); err != nil {
		return nil, err
	}
	if err := check("cuMemsetD8Async", C.dd_memset(be.ctx, p, C.size_t(bytes), be.stream)); err != nil {
		C.dd_mem_free(be.ctx, p)
		return nil, err
	}
	b.mem = &allocation{p, bytes}
	be.live += int64(bytes)
	return b, nil
}

// Free releases a buffer made by Alloc once the ops queued so far are done
// with it: its memory goes back at the next Sync or download, which wait
// for them anyway, so Free never stalls the stream. The buffer and its views
// are invalid from now on; freeing a view does nothing. Freeing a
// BlockScaled weight frees its values and scales.
func (be *Backend) Free(b kernels.Buffer) {
	if w, ok := b.(*kernels.BlockScaled); ok {
		be.Free(w.Q)
		be.Free(w.Scale)
		return
	}
	buf := asBuffer(b)
	if buf.mem == nil || buf.view {
		return
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.freed = append(be.freed, *buf.mem)
	*buf.mem = allocation{}
}

// Slice returns a view of n elements of b starting at element off.
func (be *Backend) Slice(b kernels.Buffer, off, n int) kernels.Buffer {
	buf := asBuffer(b)
	if off < 0 || n < 0 || off+n > buf.n {
		panic(fmt.Sprintf("cuda: Slice(off=%d, n=%d) out of range of a %v buffer of %d elements", off, n, buf.dt, buf.n))
	}
	return &buffer{mem: buf.mem, off: buf.off + off, n: n, dt: buf.dt, view: true}
}

// Upload copies little-endian bytes in b's dtype into b at element off.
func (be *Backend) Upload(b kernels.Buffer, off int, src []byte) error {
	buf := asBuffer(b)
	size := buf.dt.Size()
	if len(src)%size != 0 {
		return fmt.Errorf("cuda: upload of %d bytes into a %v buffer: not a multiple of the %d-byte element size", len(src), buf.dt, size)
	}
	return be.upload(buf, off, len(src)/size, unsafe.Pointer(unsafe.SliceData(src)))
}

// UploadF32 copies src into the F32 buffer b at element off.
func (be *Backend) UploadF32(b kernels.Buffer, off int, src []float32) error {
	buf := asBuffer(b)
	if buf.dt != kernels.F32 {
		return fmt.Errorf("cuda: UploadF32 into a %v buffer: use Upload with raw bytes for other dtypes", buf.dt)
	}
	return be.upload(buf, off, len(src), unsafe.Pointer(unsafe.SliceData(src)))
}

// UploadI32 copies src into the I32 buffer b at element off.
func (be *Backend) UploadI32(b kernels.Buffer, off int, src []int32) error {
	buf := asBuffer(b)
	if buf.dt != kernels.I32 {
		return fmt.Errorf("cuda: UploadI32 into a %v buffer: use Upload with raw bytes for other dtypes", buf.dt)
	}
	return be.upload(buf, off, len(src), unsafe.Pointer(unsafe.SliceData(src)))
}

// upload copies n elements from host memory (which holds no Go pointers)
// to buf at off. The driver stages the host data before it returns.
func (be *Backend) upload(buf *buffer, off, n int, src unsafe.Pointer) error {
	if err := checkRange("upload", buf, off, n); err != nil || n == 0 {
		return err
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.capturing {
		return errCapture
	}
	size := buf.dt.Size()
	be.counts.Uploads++
	be.counts.UploadBytes += int64(n * size)
	return check("cuMemcpyHtoDAsync", C.dd_htod(be.ctx, C.CUdeviceptr(buf.addr())+C.CUdeviceptr(off*size), src, C.size_t(n*size), be.stream))
}

// DownloadF32 waits for the queued ops, then copies len(dst) elements of b
// from off, converting BF16, F16, F8E4M3 and I32 elements to float32.
func (be *Backend) DownloadF32(b kernels.Buffer, off int, dst []float32) error {
	buf := asBuffer(b)
	if err := checkRange("download", buf, off, len(dst)); err != nil || len(dst) == 0 {
		return err
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.capturing {
		return errCapture
	}
	if err := be.asyncError; err != nil {
		be.asyncError = nil
		return err
	}
	size := buf.dt.Size()
	be.counts.Downloads++
	be.counts.DownloadBytes += int64(len(dst) * size)
	src := C.CUdeviceptr(buf.addr()) + C.CUdeviceptr(off*size)
	if buf.dt == kernels.F32 {
		err := check("cuMemcpyDtoH", C.dd_dtoh(be.ctx, unsafe.Pointer(unsafe.SliceData(dst)), src, C.size_t(len(dst)*4), be.stream))
		be.releaseFreed(err)
		return err
	}
	raw := make([]byte, len(dst)*size)
	err := check("cuMemcpyDtoH", C.dd_dtoh(be.ctx, unsafe.Pointer(unsafe.SliceData(raw)), src, C.size_t(len(raw)), be.stream))
	be.releaseFreed(err)
	if err != nil {
		return err
	}
	for i := range dst {
		switch buf.dt {
		case kernels.BF16:
			dst[i] = half.BF16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		case kernels.F16:
			dst[i] = half.F16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		case kernels.F8E4M3:
			dst[i] = half.E4M3ToFloat32(raw[i])
		default:
			dst[i] = float32(int32(binary.LittleEndian.Uint32(raw[4*i:])))
		}
	}
	return nil
}

// Copy copies rows×cols elements between two buffers of one dtype with strides.
func (be *Backend) Copy(dst, src kernels.Buffer, rows, cols, dstStride, srcStride int) {
	d, s := asBuffer(dst), asBuffer(src)
	if d.dt != s.dt {
		panic(fmt.Sprintf("cuda: Copy from %v to %v: dtypes must match", s.dt, d.dt))
	}
	if rows == 0 || cols == 0 {
		return
	}
	checkLen("Copy dst", d, (rows-1)*dstStride+cols)
	checkLen("Copy src", s, (rows-1)*srcStride+cols)
	name := map[int]string{4: "copy_rows_b32", 2: "copy_rows_b16"}[d.dt.Size()]
	if name == "" {
		panic(fmt.Sprintf("cuda: Copy of %v buffers: no kernel for that element size", d.dt))
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch(name, be.gridFor(rows*cols, 256), d1(256), 0, d, s, i32(rows), i32(cols), i32(dstStride), i32(srcStride))
}

// Fill sets every element of an F32 buffer to v.
func (be *Backend) Fill(dst kernels.Buffer, v float32) {
	d, variant := weights("Fill", dst, 0)
	if variant == "_f16" {
		panic("cuda: Fill needs an F32 or BF16 buffer, got F16")
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	be.launch("fill"+variant, be.gridFor(d.n, 256), d1(256), 0, d, int64(d.n), v)
}

func asBuffer(b kernels.Buffer) *buffer {
	buf, ok := b.(*buffer)
	if !ok {
		panic(fmt.Sprintf("cuda: buffer of type %T was not made by the cuda backend", b))
	}
	return buf
}

func checkRange(op string, b *buffer, off, n int) error {
	if off < 0 || n < 0 || off+n > b.n {
		return fmt.Errorf("cuda: %s of %d elements at offset %d: out of range of a %v buffer of %d elements", op, n, off, b.dt, b.n)
	}
	return nil
}

func checkLen(op string, b *buffer, n int) {
	if b.n < n {
		panic(fmt.Sprintf("cuda: %s needs %d elements, the %v buffer has %d", op, n, b.dt, b.n))
	}
}

// f32s checks that b is an F32 buffer of at least n elements.
func f32s(op string, b kernels.Buffer, n int) *buffer { return typed(op, b, n, kernels.F32) }

// i32s checks that b is an I32 buffer of at least n elements.
func i32s(op string, b kernels.Buffer, n int) *buffer { return typed(op, b, n, kernels.I32) }

func typed(op string, b kernels.Buffer, n int, dt kernels.DType) *buffer {
	buf := asBuffer(b)
	if buf.dt != dt {
		panic(fmt.Sprintf("cuda: %s needs a %v buffer, got %v", op, dt, buf.dt))
	}
	checkLen(op, buf, n)
	return buf
}

// optI32s is i32s for an optional buffer: nil stays nil (a null pointer).
func optI32s(op string, b kernels.Buffer, n int) any {
	if b == nil {
		return nil
	}
	return i32s(op, b, n)
}

// weights checks a float buffer of at least n elements and returns the
// suffix that selects a kernel's weight-type variant.
func weights(op string, b kernels.Buffer, n int) (*buffer, string) {
	buf := asBuffer(b)
	checkLen(op, buf, n)
	switch buf.dt {
	case kernels.F32:
		return buf, "_f32"
	case kernels.BF16:
		return buf, "_bf16"
	case kernels.F16:
		return buf, "_f16"
	}
	panic(fmt.Sprintf("cuda: %s needs a float buffer, got %v", op, buf.dt))
}
