// Package safetensors reads and writes Hugging Face safetensors checkpoints.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON mapping
// each tensor name to {dtype, shape, data_offsets}, then the data section.
// Offsets are relative to the start of the data section. A checkpoint
// directory holds either model.safetensors or shards listed by
// model.safetensors.index.json ({"weight_map": {tensor: file}}).
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"syscall"
)

const (
	// SingleFile is the name of an unsharded checkpoint.
	SingleFile = "model.safetensors"
	// IndexFile maps tensor names to shard files in a sharded checkpoint.
	IndexFile = "model.safetensors.index.json"

	// maxHeaderLen bounds the JSON header (the reference implementation uses 100 MB).
	maxHeaderLen = 100 << 20
)

// Tensor is one named array. Data aliases the memory-mapped file for a
// Tensor returned by a Checkpoint; it is valid until Close.
type Tensor struct {
	Name  string
	File  string // path of the file it was read from (empty when writing)
	DType string // "F32", "BF16", "F16" or "F8_E4M3"
	Shape []int
	Data  []byte
}

// Elements is the product of the shape (1 for a scalar).
func (t Tensor) Elements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// DTypeSize is the element size in bytes of a supported dtype, or 0 for any other.
func DTypeSize(dtype string) int {
	switch dtype {
	case "F32":
		return 4
	case "BF16", "F16":
		return 2
	case "F8_E4M3":
		return 1
	}
	return 0
}

// Checkpoint is an opened checkpoint directory. Its tensors alias read-only
// memory maps of the files.
type Checkpoint struct {
	Dir     string
	tensors map[string]Tensor
	maps    [][]byte
}

// Open maps every file of the checkpoint in dir and validates all headers.
func Open(dir string) (*Checkpoint, error) {
	c := &Checkpoint{Dir: dir, tensors: map[string]Tensor{}}
	indexPath := filepath.Join(dir, IndexFile)
	var err error
	if _, statErr := os.Stat(indexPath); statErr == nil {
		err = c.openSharded(indexPath)
	} else if _, statErr := os.Stat(filepath.Join(dir, SingleFile)); statErr == nil {
		err = c.openSingle(filepath.Join(dir, SingleFile))
	} else {
		err = fmt.Errorf("checkpoint %s: neither %s nor %s exists (point at a Hugging Face model directory)", dir, SingleFile, IndexFile)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Checkpoint) openSingle(path string) error {
	tensors, err := c.mapFile(path)
	if err != nil {
		return err
	}
	for _, t := range tensors {
		c.tensors[t.Name] = t
	}
	return nil
}

func (c *Checkpoint) openSharded(indexPath string) error {
	data, err := os.ReadFile(indexPath)
	if err != nil {
		return fmt.Errorf("read checkpoint index: %w", err)
	}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &index); err != nil {
		return fmt.Errorf("%s: invalid JSON: %w", indexPath, err)
	}
	if len(index.WeightMap) == 0 {
		return fmt.Errorf("%s: weight_map is missing or empty", indexPath)
	}
	byFile := map[string][]string{}
	for name, file := range index.WeightMap {
		if file == "" || filepath.Base(file) != file {
			return fmt.Errorf("%s: tensor %s: shard name %q must be a plain file name in the checkpoint directory", indexPath, name, file)
		}
		byFile[file] = append(byFile[file], name)
	}
	files := make([]string, 0, len(byFile))
	for f := range byFile {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, file := range files {
		names := byFile[file]
		sort.Strings(names)
		path := filepath.Join(c.Dir, file)
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("%s: tensor %s: shard %s: %w", indexPath, names[0], file, err)
		}
		tensors, err := c.mapFile(path)
		if err != nil {
			return err
		}
		inShard := make(map[string]Tensor, len(tensors))
		for _, t := range tensors {
			inShard[t.Name] = t
		}
		for _, name := range names {
			t, ok := inShard[name]
			if !ok {
				return fmt.Errorf("%s: tensor %s: listed in %s but missing from the shard", path, name, IndexFile)
			}
			c.tensors[name] = t
		}
	}
	return nil
}

// mapFile maps path read-only and returns its validated tensors.
func (c *Checkpoint) mapFile(path string) ([]Tensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("%s: %d bytes, too short for a safetensors header (truncated download?)", path, size)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("%s: %d bytes does not fit in memory addresses", path, size)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	c.maps = append(c.maps, mem)
	tensors, err := parse(mem, path)
	if err != nil {
		return nil, err
	}
	return tensors, nil
}

type headerEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets []uint64 `json:"data_offsets"`
}

// parse validates the header of one mapped file and returns its tensors in
// data order.
func parse(mem []byte, path string) ([]Tensor, error) {
	headerLen := binary.LittleEndian.Uint64(mem[:8])
	if headerLen > maxHeaderLen || headerLen > uint64(len(mem)-8) {
		return nil, fmt.Errorf("%s: header length %d runs past the end of the %d-byte file (truncated or not a safetensors file)", path, headerLen, len(mem))
	}
	header := mem[8 : 8+headerLen]
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON header: %w", path, err)
	}
	data := mem[8+headerLen:]
	type placed struct {
		Tensor
		begin int
	}
	names := make([]string, 0, len(raw))
	for name := range raw {
		if name != "__metadata__" {
			names = append(names, name)
		}
	}
	slices.Sort(names) // the first error reported does not depend on map order
	entries := make([]placed, 0, len(names))
	for _, name := range names {
		t, begin, err := parseEntry(name, raw[name], data, path)
		if err != nil {
			return nil, err
		}
		entries = append(entries, placed{t, begin})
	}
	// Sorted by position, any overlap shows up between neighbours.
	sort.Slice(entries, func(i, j int) bool { return entries[i].begin < entries[j].begin })
	tensors := make([]Tensor, len(entries))
	for i, e := range entries {
		if i > 0 {
			if prev := entries[i-1]; prev.begin+len(prev.Data) > e.begin {
				return nil, fmt.Errorf("%s: tensor %s: data overlaps tensor %s", path, e.Name, prev.Name)
			}
		}
		tensors[i] = e.Tensor
	}
	return tensors, nil
}

// parseEntry validates one header entry against the data section and
// returns the tensor and its offset in the data section.
func parseEntry(name string, msg json.RawMessage, data []byte, path string) (Tensor, int, error) {
	var e headerEntry
	if err := json.Unmarshal(msg, &e); err != nil {
		return Tensor{}, 0, fmt.Errorf("%s: tensor %s: invalid header entry: %w", path, name, err)
	}
	size := DTypeSize(e.DType)
	if e.DType == "F8_E5M2" {
		return Tensor{}, 0, fmt.Errorf("%s: tensor %s: unsupported dtype F8_E5M2 (ddflash reads FP8 weights only as F8_E4M3 with block scales, the format of Qwen's FP8 checkpoints)", path, name)
	}
	if size == 0 {
		return Tensor{}, 0, fmt.Errorf("%s: tensor %s: unsupported dtype %q (ddflash reads F32, BF16, F16 and F8_E4M3)", path, name, e.DType)
	}
	if e.Shape == nil {
		return Tensor{}, 0, fmt.Errorf("%s: tensor %s: shape is missing", path, name)
	}
	elems := uint64(1)
	for _, d := range e.Shape {
		if d < 0 {
			return Tensor{}, 0, fmt.Errorf("%s: tensor %s: negative dimension in shape %v", path, name, e.Shape)
		}
		if d != 0 && elems > uint64(len(data))/uint64(d) {
			return Tensor{}, 0, fmt.Errorf("%s: tensor %s: shape %v is larger than the file", path, name, e.Shape)
		}
		elems *= uint64(d)
	}
	if len(e.DataOffsets) != 2 {
		return Tensor{}, 0, fmt.Errorf("%s: tensor %s: data_offsets must be [begin, end], got %v", path, name, e.DataOffsets)
	}
	begin, end := e.DataOffsets[0], e.DataOffsets[1]
	if begin > end || end > uint64(len(data)) {
		return Tensor{}, 0, fmt.Errorf("%s: tensor %s: data_offsets [%d, %d] lie outside the %d-byte data section (truncated file?)", path, name, begin, end, len(data))
	}
	if want := elems * uint64(size); end-begin != want {
		return Tensor{}, 0, fmt.Errorf("%s: tensor %s: data_offsets span %d bytes but %s %v needs %d", path, name, end-begin, e.DType, e.Shape, want)
	}
	return Tensor{Name: name, File: path, DType: e.DType, Shape: e.Shape, Data: data[begin:end:end]}, int(begin), nil
}

// Tensor returns the named tensor.
func (c *Checkpoint) Tensor(name string) (Tensor, bool) {
	t, ok := c.tensors[name]
	return t, ok
}

// Names lists every tensor, sorted.
func (c *Checkpoint) Names() []string {
	names := make([]string, 0, len(c.tensors))
	for n := range c.tensors {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Close unmaps the files. Tensor data must not be used afterwards.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, m := range c.maps {
		if err := syscall.Munmap(m); err != nil {
			errs = append(errs, err)
		}
	}
	c.maps = nil
	c.tensors = nil
	return errors.Join(errs...)
}
