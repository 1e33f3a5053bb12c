// Package cpu is the pure-Go reference backend: buffers are Go slices and
// every op runs synchronously, the heavy ones spread over a worker pool.
package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"ddflash/internal/half"
	"ddflash/kernels"
)

// buffer is the CPU Buffer. Exactly one of the slices is set, by dtype; a
// Slice view shares the parent's backing array.
type buffer struct {
	dt  kernels.DType
	f32 []float32
	u16 []uint16 // BF16 and F16 bit patterns
	u8  []uint8  // F8E4M3 bit patterns
	i32 []int32
}

func (b *buffer) DType() kernels.DType { return b.dt }

func (b *buffer) Len() int {
	switch b.dt {
	case kernels.F32:
		return len(b.f32)
	case kernels.BF16, kernels.F16:
		return len(b.u16)
	case kernels.F8E4M3:
		return len(b.u8)
	default:
		return len(b.i32)
	}
}

// Backend runs every op on the calling goroutine plus a fixed worker pool.
type Backend struct {
	pool  *pool
	kern  *kernelSet
	temps temps
}

var _ kernels.Backend = (*Backend)(nil)

// New returns a CPU backend using threads workers (runtime.NumCPU() when threads <= 0).
// It uses the AVX-512 kernels, else the AVX2 ones, when the build and the
// CPU have them.
func New(threads int) kernels.Backend {
	kern := portableKernels
	if simd := simdKernels(); len(simd) > 0 {
		kern = simd[0]
	}
	return newBackend(threads, kern, defaultMinWork)
}

// newBackend lets tests choose the kernels and force fine-grained splits.
func newBackend(threads int, kern kernelSet, minWork int) *Backend {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	b := &Backend{pool: newPool(threads, minWork), kern: &kern}
	// The workers only reference the pool, so an unreachable Backend can stop them.
	runtime.AddCleanup(b, func(p *pool) { p.close() }, b.pool)
	return b
}

// Name reports the backend and its thread count.
func (be *Backend) Name() string {
	return fmt.Sprintf("cpu(%d threads, %s kernels)", be.pool.threads, be.kern.name)
}

// Alloc returns a zeroed buffer of n elements.
func (be *Backend) Alloc(dt kernels.DType, n int) (kernels.Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("cpu: alloc of %d %v elements: length must not be negative", n, dt)
	}
	switch dt {
	case kernels.F32:
		return &buffer{dt: dt, f32: allocSlice[float32](n)}, nil
	case kernels.BF16, kernels.F16:
		return &buffer{dt: dt, u16: allocSlice[uint16](n)}, nil
	case kernels.I32:
		return &buffer{dt: dt, i32: allocSlice[int32](n)}, nil
	case kernels.F8E4M3:
		return &buffer{dt: dt, u8: allocSlice[uint8](n)}, nil
	}
	return nil, fmt.Errorf("cpu: alloc: unknown dtype %v", dt)
}

// hugePage is the size of a transparent huge page on x86-64 (and on arm64
// with 4 KiB base pages).
const hugePage = 2 << 20

// hugePageMin is the least buffer size whose memory is advised to be backed
// by huge pages: it holds at least one whole huge page, and smaller ones
// (norm weights, a step's activations) gain nothing.
const hugePageMin = 2 * hugePage

// allocSlice returns n zeroed elements; a large one's memory is advised to
// be backed by huge pages (see adviseHugePages).
func allocSlice[T float32 | uint16 | uint8 | int32](n int) []T {
	s := make([]T, n)
	if bytes := n * int(unsafe.Sizeof(s[0])); bytes >= hugePageMin {
		adviseHugePages(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), bytes))
	}
	return s
}

// Free drops the buffer's memory (both parts of a BlockScaled weight); the garbage collector reclaims it once no
// view references it.
func (be *Backend) Free(b kernels.Buffer) {
	if w, ok := b.(*kernels.BlockScaled); ok {
		be.Free(w.Q)
		be.Free(w.Scale)
		return
	}
	buf := asBuffer(b)
	buf.f32, buf.u16, buf.u8, buf.i32 = nil, nil, nil, nil
}

// Slice returns a view of n elements of b starting at element off.
func (be *Backend) Slice(b kernels.Buffer, off, n int) kernels.Buffer {
	buf := asBuffer(b)
	if off < 0 || n < 0 || off+n > buf.Len() {
		panic(fmt.Sprintf("cpu: Slice(off=%d, n=%d) out of range of a %v buffer of %d elements", off, n, buf.dt, buf.Len()))
	}
	view := &buffer{dt: buf.dt}
	switch buf.dt {
	case kernels.F32:
		view.f32 = buf.f32[off : off+n : off+n]
	case kernels.BF16, kernels.F16:
		view.u16 = buf.u16[off : off+n : off+n]
	case kernels.F8E4M3:
		view.u8 = buf.u8[off : off+n : off+n]
	default:
		view.i32 = buf.i32[off : off+n : off+n]
	}
	return view
}

// Upload copies little-endian bytes in b's dtype into b at element off.
func (be *Backend) Upload(b kernels.Buffer, off int, src []byte) error {
	buf := asBuffer(b)
	size := buf.dt.Size()
	if len(src)%size != 0 {
		return fmt.Errorf("cpu: upload of %d bytes into a %v buffer: not a multiple of the %d-byte element size", len(src), buf.dt, size)
	}
	n := len(src) / size
	if err := checkRange("upload", buf, off, n); err != nil {
		return err
	}
	switch buf.dt {
	case kernels.F32:
		dst := buf.f32[off : off+n]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case kernels.BF16, kernels.F16:
		dst := buf.u16[off : off+n]
		for i := range dst {
			dst[i] = binary.LittleEndian.Uint16(src[2*i:])
		}
	case kernels.F8E4M3:
		copy(buf.u8[off:off+n], src)
	default:
		dst := buf.i32[off : off+n]
		for i := range dst {
			dst[i] = int32(binary.LittleEndian.Uint32(src[4*i:]))
		}
	}
	return nil
}

// UploadF32 copies src into the F32 buffer b at element off.
func (be *Backend) UploadF32(b kernels.Buffer, off int, src []float32) error {
	buf := asBuffer(b)
	if buf.dt != kernels.F32 {
		return fmt.Errorf("cpu: UploadF32 into a %v buffer: use Upload with raw bytes for other dtypes", buf.dt)
	}
	if err := checkRange("upload", buf, off, len(src)); err != nil {
		return err
	}
	copy(buf.f32[off:], src)
	return nil
}

// UploadI32 copies src into the I32 buffer b at element off.
func (be *Backend) UploadI32(b kernels.Buffer, off int, src []int32) error {
	buf := asBuffer(b)
	if buf.dt != kernels.I32 {
		return fmt.Errorf("cpu: UploadI32 into a %v buffer: use Upload with raw bytes for other dtypes", buf.dt)
	}
	if err := checkRange("upload", buf, off, len(src)); err != nil {
		return err
	}
	copy(buf.i32[off:], src)
	return nil
}

// DownloadF32 copies len(dst) elements of b from off, converting BF16, F16,
// F8E4M3 and I32 elements to float32 (I32 values are exact below 2^24).
func (be *Backend) DownloadF32(b kernels.Buffer, off int, dst []float32) error {
	buf := asBuffer(b)
	if err := checkRange("download", buf, off, len(dst)); err != nil {
		return err
	}
	switch buf.dt {
	case kernels.F32:
		copy(dst, buf.f32[off:])
	case kernels.BF16:
		for i, h := range buf.u16[off : off+len(dst)] {
			dst[i] = half.BF16ToFloat32(h)
		}
	case kernels.F16:
		for i, h := range buf.u16[off : off+len(dst)] {
			dst[i] = half.F16ToFloat32(h)
		}
	case kernels.F8E4M3:
		for i, q := range buf.u8[off : off+len(dst)] {
			dst[i] = half.E4M3ToFloat32(q)
		}
	default:
		for i, v := range buf.i32[off : off+len(dst)] {
			dst[i] = float32(v)
		}
	}
	return nil
}

// Sync returns at once: every op has finished when it returns.
func (be *Backend) Sync() error { return nil }

// Copy copies rows×cols elements between two buffers of one dtype with strides.
func (be *Backend) Copy(dst, src kernels.Buffer, rows, cols, dstStride, srcStride int) {
	d, s := asBuffer(dst), asBuffer(src)
	if d.dt != s.dt {
		panic(fmt.Sprintf("cpu: Copy from %v to %v: dtypes must match", s.dt, d.dt))
	}
	if rows == 0 || cols == 0 {
		return
	}
	need := func(stride int) int { return (rows-1)*stride + cols }
	checkLen("Copy dst", d, need(dstStride))
	checkLen("Copy src", s, need(srcStride))
	switch d.dt {
	case kernels.F32:
		copyRows(d.f32, s.f32, rows, cols, dstStride, srcStride)
	case kernels.BF16, kernels.F16:
		copyRows(d.u16, s.u16, rows, cols, dstStride, srcStride)
	case kernels.F8E4M3:
		copyRows(d.u8, s.u8, rows, cols, dstStride, srcStride)
	default:
		copyRows(d.i32, s.i32, rows, cols, dstStride, srcStride)
	}
}

func copyRows[T any](dst, src []T, rows, cols, dstStride, srcStride int) {
	for r := range rows {
		copy(dst[r*dstStride:r*dstStride+cols], src[r*srcStride:r*srcStride+cols])
	}
}

// Fill sets every element of an F32 buffer to v.
func (be *Backend) Fill(dst kernels.Buffer, v float32) {
	d := asBuffer(dst)
	if d.dt == kernels.BF16 {
		bits := half.Float32ToBF16(v)
		for i := range d.u16 {
			d.u16[i] = bits
		}
		return
	}
	checkDType("Fill", d, kernels.F32)
	for i := range d.f32 {
		d.f32[i] = v
	}
}

func asBuffer(b kernels.Buffer) *buffer {
	buf, ok := b.(*buffer)
	if !ok {
		panic(fmt.Sprintf("cpu: buffer of type %T was not made by the cpu backend", b))
	}
	return buf
}

func checkRange(op string, b *buffer, off, n int) error {
	if off < 0 || off+n > b.Len() {
		return fmt.Errorf("cpu: %s of %d elements at offset %d: out of range of a %v buffer of %d elements", op, n, off, b.dt, b.Len())
	}
	return nil
}

func checkDType(op string, b *buffer, want kernels.DType) {
	if b.dt != want {
		panic(fmt.Sprintf("cpu: %s needs a %v buffer, got %v", op, want, b.dt))
	}
}

func checkLen(op string, b *buffer, n int) {
	if b.Len() < n {
		panic(fmt.Sprintf("cpu: %s needs %d elements, the %v buffer has %d", op, n, b.dt, b.Len()))
	}
}

// f32s returns the first n elements of an F32 buffer, panicking on a wrong dtype or short buffer.
func f32s(op string, b kernels.Buffer, n int) []float32 {
	buf := asBuffer(b)
	checkDType(op, buf, kernels.F32)
	checkLen(op, buf, n)
	return buf.f32[:n]
}

// i32s returns the first n elements of an I32 buffer.
func i32s(op string, b kernels.Buffer, n int) []int32 {
	buf := asBuffer(b)
	checkDType(op, buf, kernels.I32)
	checkLen(op, buf, n)
	return buf.i32[:n]
}

// widened returns the first n elements of a float buffer as float32: the
// buffer itself when F32, else a converted copy (used for small weight vectors).
func widened(op string, b kernels.Buffer, n int) []float32 {
	buf := asBuffer(b)
	checkLen(op, buf, n)
	switch buf.dt {
	case kernels.F32:
		return buf.f32[:n]
	case kernels.BF16, kernels.F16:
		out := make([]float32, n)
		widenInto(out, buf.u16[:n], buf.dt)
		return out
	}
	panic(fmt.Sprintf("cpu: %s needs a float buffer, got %v", op, buf.dt))
}
