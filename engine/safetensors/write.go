package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Write stores tensors in one safetensors file at path, data in the given
// order. metadata goes under "__metadata__" when non-empty.
func Write(path string, tensors []Tensor, metadata map[string]string) (err error) {
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var offset uint64
	for _, t := range tensors {
		if err := checkWritable(t); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		if _, dup := header[t.Name]; dup {
			return fmt.Errorf("write %s: tensor %s appears twice", path, t.Name)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		end := offset + uint64(len(t.Data))
		header[t.Name] = headerEntry{DType: t.DType, Shape: shape, DataOffsets: []uint64{offset, end}}
		offset = end
	}
	js, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("write %s: encode header: %w", path, err)
	}
	// Pad the header with spaces so the data section starts 8-byte aligned,
	// as the reference writer does.
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write safetensors file: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write %s: %w", path, cerr)
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	var lenBytes [8]byte
	binary.LittleEndian.PutUint64(lenBytes[:], uint64(len(js)))
	w.Write(lenBytes[:])
	w.Write(js)
	for _, t := range tensors {
		w.Write(t.Data)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func checkWritable(t Tensor) error {
	size := DTypeSize(t.DType)
	if size == 0 {
		return fmt.Errorf("tensor %s: unsupported dtype %q", t.Name, t.DType)
	}
	if t.Name == "" || t.Name == "__metadata__" {
		return fmt.Errorf("tensor name %q is reserved or empty", t.Name)
	}
	if want := t.Elements() * size; len(t.Data) != want {
		return fmt.Errorf("tensor %s: %d data bytes for %s %v, want %d", t.Name, len(t.Data), t.DType, t.Shape, want)
	}
	return nil
}

// ShardName is the Hugging Face name of shard i (0-based) of n.
func ShardName(i, n int) string {
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n)
}

// WriteCheckpoint stores tensors in dir: as model.safetensors when shards <= 1,
// otherwise as shards of roughly equal size plus model.safetensors.index.json.
// Tensors keep their order; a shard never splits a tensor.
func WriteCheckpoint(dir string, tensors []Tensor, shards int, metadata map[string]string) error {
	if shards <= 1 {
		return Write(filepath.Join(dir, SingleFile), tensors, metadata)
	}
	if shards > len(tensors) {
		return fmt.Errorf("write checkpoint %s: %d shards for %d tensors; use at most one shard per tensor", dir, shards, len(tensors))
	}
	total := 0
	for _, t := range tensors {
		total += len(t.Data)
	}
	groups := splitBalanced(tensors, shards, total)
	weightMap := map[string]string{}
	for i, group := range groups {
		name := ShardName(i, shards)
		if err := Write(filepath.Join(dir, name), group, metadata); err != nil {
			return err
		}
		for _, t := range group {
			weightMap[t.Name] = name
		}
	}
	index := map[string]any{
		"metadata":   map[string]any{"total_size": total},
		"weight_map": weightMap,
	}
	js, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		return fmt.Errorf("write checkpoint index: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, IndexFile), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("write checkpoint index: %w", err)
	}
	return nil
}

// splitBalanced cuts tensors into exactly n non-empty consecutive groups,
// closing a group once it reaches its share of the bytes.
func splitBalanced(tensors []Tensor, n, total int) [][]Tensor {
	groups := make([][]Tensor, 0, n)
	start, bytes := 0, 0
	for i, t := range tensors {
		bytes += len(t.Data)
		remainingTensors := len(tensors) - i - 1
		remainingGroups := n - len(groups) - 1
		full := bytes*n >= total*(len(groups)+1)
		if remainingGroups > 0 && (full || remainingTensors == remainingGroups) {
			groups = append(groups, tensors[start:i+1])
			start = i + 1
		}
	}
	return append(groups, tensors[start:])
}
