package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sampleTensors covers every supported dtype plus a scalar and an empty tensor.
func sampleTensors(t *testing.T) []Tensor {
	t.Helper()
	values := []float32{0, 1, -2.5, 0.1, 3e-5, -65504, 1234.5, float32(math.Inf(1))}
	var out []Tensor
	for _, dt := range []string{"F32", "BF16", "F16"} {
		data, err := Encode(dt, values)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, Tensor{Name: "layer." + dt + ".weight", DType: dt, Shape: []int{2, 4}, Data: data})
	}
	scalar, _ := Encode("F32", []float32{42})
	out = append(out,
		Tensor{Name: "scalar", DType: "F32", Shape: []int{}, Data: scalar},
		Tensor{Name: "empty", DType: "BF16", Shape: []int{0, 3}, Data: []byte{}},
	)
	return out
}

func checkSame(t *testing.T, c *Checkpoint, want []Tensor) {
	t.Helper()
	var names []string
	for _, w := range want {
		names = append(names, w.Name)
		got, ok := c.Tensor(w.Name)
		if !ok {
			t.Errorf("tensor %s missing after round trip", w.Name)
			continue
		}
		if got.DType != w.DType || !slices.Equal(got.Shape, w.Shape) || !slices.Equal(got.Data, w.Data) {
			t.Errorf("tensor %s: got %s %v %d bytes, want %s %v %d bytes", w.Name, got.DType, got.Shape, len(got.Data), w.DType, w.Shape, len(w.Data))
		}
	}
	slices.Sort(names)
	if !slices.Equal(c.Names(), names) {
		t.Errorf("Names() = %v, want %v", c.Names(), names)
	}
}

func TestRoundTripSingleFile(t *testing.T) {
	dir := t.TempDir()
	want := sampleTensors(t)
	if err := WriteCheckpoint(dir, want, 1, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkSame(t, c, want)
	for _, n := range c.Names() {
		if tensor, _ := c.Tensor(n); tensor.File != filepath.Join(dir, SingleFile) {
			t.Errorf("tensor %s: File = %q", n, tensor.File)
		}
	}
}

// TestWriteLayout reads the written file by hand against the format spec:
// u64 header length, JSON header, data section starting 8-byte aligned,
// offsets relative to the data section.
func TestWriteLayout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.safetensors")
	a, _ := Encode("F32", []float32{1, 2, 3})
	b, _ := Encode("BF16", []float32{4, 5})
	if err := Write(path, []Tensor{{Name: "a", DType: "F32", Shape: []int{3}, Data: a}, {Name: "b", DType: "BF16", Shape: []int{1, 2}, Data: b}}, map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	if (8+n)%8 != 0 {
		t.Errorf("data section starts at %d, not 8-byte aligned", 8+n)
	}
	type entry struct {
		DType   string `json:"dtype"`
		Shape   []int  `json:"shape"`
		Offsets [2]int `json:"data_offsets"`
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &fields); err != nil {
		t.Fatal(err)
	}
	var meta map[string]string
	if err := json.Unmarshal(fields["__metadata__"], &meta); err != nil || meta["k"] != "v" {
		t.Errorf("metadata not stored: %v %v", meta, err)
	}
	header := map[string]entry{}
	for _, name := range []string{"a", "b"} {
		var e entry
		if err := json.Unmarshal(fields[name], &e); err != nil {
			t.Fatalf("entry %s: %v", name, err)
		}
		header[name] = e
	}
	data := raw[8+n:]
	if e := header["a"]; e.DType != "F32" || e.Offsets != [2]int{0, 12} || !slices.Equal(data[0:12], a) {
		t.Errorf("entry a = %+v", e)
	}
	if e := header["b"]; e.DType != "BF16" || !slices.Equal(e.Shape, []int{1, 2}) || e.Offsets != [2]int{12, 16} || !slices.Equal(data[12:16], b) {
		t.Errorf("entry b = %+v", e)
	}
	if len(data) != 16 {
		t.Errorf("data section is %d bytes, want 16", len(data))
	}
}

func TestRoundTripSharded(t *testing.T) {
	dir := t.TempDir()
	want := sampleTensors(t)
	if err := WriteCheckpoint(dir, want, 3, nil); err != nil {
		t.Fatal(err)
	}
	var index struct {
		Metadata  map[string]int    `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &index); err != nil {
		t.Fatal(err)
	}
	total := 0
	shards := map[string]bool{}
	for _, w := range want {
		total += len(w.Data)
		shards[index.WeightMap[w.Name]] = true
	}
	if index.Metadata["total_size"] != total {
		t.Errorf("total_size %d, want %d", index.Metadata["total_size"], total)
	}
	for i := 0; i < 3; i++ {
		if !shards[ShardName(i, 3)] {
			t.Errorf("no tensor in shard %s (weight_map %v)", ShardName(i, 3), index.WeightMap)
		}
	}
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkSame(t, c, want)
	for _, w := range want {
		got, _ := c.Tensor(w.Name)
		if got.File != filepath.Join(dir, index.WeightMap[w.Name]) {
			t.Errorf("tensor %s: File %q, index says %q", w.Name, got.File, index.WeightMap[w.Name])
		}
	}
}

func TestWriteRejectsBadTensors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name   string
		tensor Tensor
	}{
		{"dtype", Tensor{Name: "w", DType: "I8", Shape: []int{1}, Data: []byte{0}}},
		{"size", Tensor{Name: "w", DType: "F32", Shape: []int{2}, Data: make([]byte, 4)}},
		{"reserved", Tensor{Name: "__metadata__", DType: "F32", Shape: []int{1}, Data: make([]byte, 4)}},
	} {
		if err := Write(filepath.Join(dir, "x.safetensors"), []Tensor{tc.tensor}, nil); err == nil {
			t.Errorf("%s: Write accepted %+v", tc.name, tc.tensor)
		}
	}
}

// rawFile writes a safetensors file with the given header text and data size.
func rawFile(t *testing.T, dir, header string, dataLen int) string {
	t.Helper()
	buf := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	buf = append(buf, header...)
	buf = append(buf, make([]byte, dataLen)...)
	path := filepath.Join(dir, SingleFile)
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// wantOpenError opens dir and checks the error mentions every fragment.
func wantOpenError(t *testing.T, dir string, fragments ...string) {
	t.Helper()
	c, err := Open(dir)
	if err == nil {
		c.Close()
		t.Fatalf("Open succeeded, want an error mentioning %q", fragments)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not mention %q", err, f)
		}
	}
}

func TestOpenRejectsMalformedFiles(t *testing.T) {
	for _, tc := range []struct {
		name    string
		header  string
		dataLen int
		want    []string // besides the file path
	}{
		{"bad JSON", `{"w": {"dtype": "F32",`, 4, []string{"invalid JSON header"}},
		{"unknown dtype", `{"w.q": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}}`, 4, []string{"w.q", `"I8"`}},
		{"offsets past end", `{"w.q": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}`, 4, []string{"w.q", "outside"}},
		{"offsets reversed", `{"w.q": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}}`, 4, []string{"w.q", "outside"}},
		{"size mismatch", `{"w.q": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 4]}}`, 4, []string{"w.q", "needs 6"}},
		{"offsets not a pair", `{"w.q": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}`, 4, []string{"w.q", "data_offsets"}},
		{"negative dimension", `{"w.q": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}`, 4, []string{"w.q", "negative"}},
		{"huge shape", `{"w.q": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 4]}}`, 4, []string{"w.q", "larger than the file"}},
		{"missing shape", `{"w.q": {"dtype": "F32", "data_offsets": [0, 4]}}`, 4, []string{"w.q", "shape"}},
		{"overlap", `{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}`, 8, []string{"overlaps"}},
		{"entry not an object", `{"w.q": [1, 2]}`, 0, []string{"w.q", "invalid header entry"}},
		{"F8_E5M2", `{"w.q": {"dtype": "F8_E5M2", "shape": [4], "data_offsets": [0, 4]}}`, 4, []string{"w.q", "F8_E5M2", "F8_E4M3"}},
		{"FP8 scale truncated", `{"w.weight_scale_inv": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}`, 12, []string{"w.weight_scale_inv", "needs 16"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := rawFile(t, dir, tc.header, tc.dataLen)
			wantOpenError(t, dir, append(tc.want, path)...)
		})
	}
}

func TestOpenRejectsTruncatedFiles(t *testing.T) {
	t.Run("shorter than the length prefix", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, SingleFile)
		os.WriteFile(path, []byte{1, 2, 3}, 0o644)
		wantOpenError(t, dir, path, "too short")
	})
	t.Run("header length past EOF", func(t *testing.T) {
		dir := t.TempDir()
		path := rawFile(t, dir, `{}`, 0)
		raw, _ := os.ReadFile(path)
		binary.LittleEndian.PutUint64(raw, 1<<40)
		os.WriteFile(path, raw, 0o644)
		wantOpenError(t, dir, path, "header length")
	})
	t.Run("data cut short", func(t *testing.T) {
		dir := t.TempDir()
		tensors := sampleTensors(t)
		tensors = tensors[:len(tensors)-1] // drop the empty tensor at the very end
		if err := WriteCheckpoint(dir, tensors, 1, nil); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, SingleFile)
		st, _ := os.Stat(path)
		os.Truncate(path, st.Size()-1)
		// Written in order, the last tensor with data ("scalar") is the one cut.
		wantOpenError(t, dir, path, "scalar", "truncated")
	})
}

func TestOpenRejectsBadIndex(t *testing.T) {
	sharded := func(t *testing.T) (string, map[string]any) {
		dir := t.TempDir()
		if err := WriteCheckpoint(dir, sampleTensors(t), 2, nil); err != nil {
			t.Fatal(err)
		}
		var index map[string]any
		raw, _ := os.ReadFile(filepath.Join(dir, IndexFile))
		json.Unmarshal(raw, &index)
		return dir, index
	}
	rewrite := func(t *testing.T, dir string, index map[string]any) {
		raw, _ := json.Marshal(index)
		if err := os.WriteFile(filepath.Join(dir, IndexFile), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("missing shard file", func(t *testing.T) {
		dir, index := sharded(t)
		index["weight_map"].(map[string]any)["scalar"] = "model-00009-of-00009.safetensors"
		rewrite(t, dir, index)
		wantOpenError(t, dir, "scalar", "model-00009-of-00009.safetensors", IndexFile)
	})
	t.Run("tensor not in its shard", func(t *testing.T) {
		dir, index := sharded(t)
		wm := index["weight_map"].(map[string]any)
		// Point the first tensor at the shard that does not hold it.
		other := ShardName(0, 2)
		if wm["layer.F32.weight"] == other {
			other = ShardName(1, 2)
		}
		wm["layer.F32.weight"] = other
		rewrite(t, dir, index)
		wantOpenError(t, dir, "layer.F32.weight", filepath.Join(dir, other), "missing from the shard")
	})
	t.Run("shard outside the directory", func(t *testing.T) {
		dir, index := sharded(t)
		index["weight_map"].(map[string]any)["scalar"] = "../elsewhere.safetensors"
		rewrite(t, dir, index)
		wantOpenError(t, dir, "scalar", "plain file name")
	})
	t.Run("bad JSON", func(t *testing.T) {
		dir, _ := sharded(t)
		os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"weight_map": `), 0o644)
		wantOpenError(t, dir, filepath.Join(dir, IndexFile), "invalid JSON")
	})
	t.Run("empty weight map", func(t *testing.T) {
		dir, index := sharded(t)
		index["weight_map"] = map[string]any{}
		rewrite(t, dir, index)
		wantOpenError(t, dir, IndexFile, "weight_map")
	})
	t.Run("no checkpoint", func(t *testing.T) {
		dir := t.TempDir()
		wantOpenError(t, dir, dir, SingleFile, IndexFile)
	})
}

// FuzzParse feeds arbitrary bytes to the header parser: it must return an
// error or valid tensors, never panic or hand out data outside the file.
func FuzzParse(f *testing.F) {
	f.Add([]byte{})
	f.Add(binary.LittleEndian.AppendUint64(nil, 2))
	header := `{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}`
	good := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	good = append(good, header...)
	f.Add(append(good, 0, 0, 128, 63))
	f.Fuzz(func(t *testing.T, file []byte) {
		if len(file) < 8 {
			return // mapFile rejects these before parse
		}
		tensors, err := parse(file, "fuzz")
		if err != nil {
			return
		}
		for _, tensor := range tensors {
			if len(tensor.Data) != tensor.Elements()*DTypeSize(tensor.DType) {
				t.Fatalf("tensor %s: %d bytes for %v", tensor.Name, len(tensor.Data), tensor.Shape)
			}
		}
	})
}
