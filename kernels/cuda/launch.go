//go:build cgo

package cuda

/*
#include <stdlib.h>
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"ddflash/kernels"
)

// devPtr is a raw device address passed to a kernel.
type devPtr uint64

// argPacker lays out kernel arguments in C memory for cuLaunchKernel: an
// array of n pointers, each to its argument's value further on in the same
// block, values 8-byte aligned. The block is reused from launch to launch
// (the driver copies the values at launch), under the Backend's mutex.
type argPacker struct {
	mem unsafe.Pointer
	cap int
}

// pack writes args and returns the pointer array. Each arg is a
// kernels.Buffer (its device address; a nil Buffer is a null pointer),
// devPtr, int32, int64, float32 or []byte (a struct passed by value).
func (p *argPacker) pack(args []any) *unsafe.Pointer {
	size := 8 * len(args)
	vals := make([][]byte, len(args))
	for i, a := range args {
		vals[i] = argBytes(a)
		size += (len(vals[i]) + 7) &^ 7
	}
	if size > p.cap {
		C.free(p.mem)
		p.cap = max(size, 4096)
		p.mem = C.malloc(C.size_t(p.cap))
		if p.mem == nil {
			panic("cuda: out of host memory for kernel arguments")
		}
	}
	block := unsafe.Slice((*byte)(p.mem), size)
	ptrs := unsafe.Slice((*unsafe.Pointer)(p.mem), len(args))
	off := 8 * len(args)
	for i, v := range vals {
		copy(block[off:], v)
		ptrs[i] = unsafe.Add(p.mem, off)
		off += (len(v) + 7) &^ 7
	}
	return (*unsafe.Pointer)(p.mem)
}

func argBytes(a any) []byte {
	switch v := a.(type) {
	case nil:
		return make([]byte, 8)
	case kernels.Buffer:
		return binary.LittleEndian.AppendUint64(nil, uint64(asBuffer(v).addr()))
	case devPtr:
		return binary.LittleEndian.AppendUint64(nil, uint64(v))
	case int32:
		return binary.LittleEndian.AppendUint32(nil, uint32(v))
	case int64:
		return binary.LittleEndian.AppendUint64(nil, uint64(v))
	case float32:
		return binary.LittleEndian.AppendUint32(nil, math.Float32bits(v))
	case []byte:
		return v
	}
	panic(fmt.Sprintf("cuda: kernel argument of type %T", a))
}

// i32 converts a size to a kernel's int argument.
func i32(n int) int32 {
	if n < math.MinInt32 || n > math.MaxInt32 {
		panic(fmt.Sprintf("cuda: %d does not fit a kernel's 32-bit int argument", n))
	}
	return int32(n)
}
