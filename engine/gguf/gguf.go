// Package gguf writes GGUF files (llama.cpp's model format, version 3) and
// converts a Qwen3.5/3.6 text checkpoint to llama.cpp's qwen35 architecture,
// so that llama.cpp can run the same weights as ddflash (scripts/llamacpp-compare.sh).
package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math"
	"os"
)

// Value types of metadata (gguf_type).
const (
	typeUint32  = 4
	typeInt32   = 5
	typeFloat32 = 6
	typeBool    = 7
	typeString  = 8
	typeArray   = 9
)

// Tensor types (ggml_type) written here.
const (
	TypeF32  = 0
	TypeF16  = 1
	TypeBF16 = 30
)

// alignment is GGUF's default data alignment (general.alignment unset).
const alignment = 32

// KV is one metadata entry; Value is uint32, int32, float32, bool, string,
// []int32 or []string.
type KV struct {
	Key   string
	Value any
}

// Tensor is one tensor: Dims in ggml order (the fastest-varying first, so
// a row-major [rows, cols] matrix has Dims {cols, rows}) and its raw data.
type Tensor struct {
	Name string
	Type uint32
	Dims []uint64
	Data []byte
}

func typeSize(t uint32) (int, error) {
	switch t {
	case TypeF32:
		return 4, nil
	case TypeF16, TypeBF16:
		return 2, nil
	}
	return 0, fmt.Errorf("gguf: unsupported tensor type %d", t)
}

// Write writes a GGUF v3 file.
func Write(path string, kvs []KV, tensors []Tensor) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := &writer{w: bufio.NewWriterSize(f, 1<<20)}
	w.raw([]byte("GGUF"))
	w.u32(3)
	w.u64(uint64(len(tensors)))
	w.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		w.str(kv.Key)
		if err := w.value(kv.Value); err != nil {
			return fmt.Errorf("gguf: key %s: %w", kv.Key, err)
		}
	}
	var offset uint64
	for _, t := range tensors {
		size, err := typeSize(t.Type)
		if err != nil {
			return err
		}
		n := uint64(1)
		for _, d := range t.Dims {
			n *= d
		}
		if n*uint64(size) != uint64(len(t.Data)) {
			return fmt.Errorf("gguf: tensor %s: dims %v need %d bytes, have %d", t.Name, t.Dims, n*uint64(size), len(t.Data))
		}
		w.str(t.Name)
		w.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			w.u64(d)
		}
		w.u32(t.Type)
		w.u64(offset)
		offset = padded(offset + uint64(len(t.Data)))
	}
	w.pad()
	for _, t := range tensors {
		w.raw(t.Data)
		w.pad()
	}
	if w.err != nil {
		return w.err
	}
	return w.w.Flush()
}

func padded(n uint64) uint64 { return (n + alignment - 1) / alignment * alignment }

// writer is a little-endian stream that keeps its first error.
type writer struct {
	w   *bufio.Writer
	n   uint64
	err error
}

func (w *writer) raw(b []byte) {
	if w.err != nil {
		return
	}
	_, w.err = w.w.Write(b)
	w.n += uint64(len(b))
}

func (w *writer) u32(v uint32) { w.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (w *writer) u64(v uint64) { w.raw(binary.LittleEndian.AppendUint64(nil, v)) }
func (w *writer) str(s string) { w.u64(uint64(len(s))); w.raw([]byte(s)) }
func (w *writer) pad()         { w.raw(make([]byte, padded(w.n)-w.n)) }

func (w *writer) value(v any) error {
	switch v := v.(type) {
	case uint32:
		w.u32(typeUint32)
		w.u32(v)
	case int32:
		w.u32(typeInt32)
		w.u32(uint32(v))
	case float32:
		w.u32(typeFloat32)
		w.u32(math.Float32bits(v))
	case bool:
		w.u32(typeBool)
		w.raw([]byte{boolByte(v)})
	case string:
		w.u32(typeString)
		w.str(v)
	case []int32:
		w.u32(typeArray)
		w.u32(typeInt32)
		w.u64(uint64(len(v)))
		for _, x := range v {
			w.u32(uint32(x))
		}
	case []string:
		w.u32(typeArray)
		w.u32(typeString)
		w.u64(uint64(len(v)))
		for _, s := range v {
			w.str(s)
		}
	default:
		return fmt.Errorf("unsupported value type %T", v)
	}
	return nil
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}
