package gguf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"ddflash/engine/safetensors"
	"ddflash/engine/testmodel"
)

// parsed is a GGUF file as read back by readGGUF, an independent reader
// of the format (llama.cpp's gguf.cpp layout).
type parsed struct {
	kv      map[string]any
	tensors map[string]Tensor
	offsets []uint64
}

func readGGUF(t *testing.T, path string) parsed {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := bytes.NewReader(data)
	var hdr struct {
		Magic          [4]byte
		Version        uint32
		Tensors, Pairs uint64
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(binary.Read(r, binary.LittleEndian, &hdr))
	if string(hdr.Magic[:]) != "GGUF" || hdr.Version != 3 {
		t.Fatalf("header %q v%d, want GGUF v3", hdr.Magic, hdr.Version)
	}
	u32 := func() uint32 { var v uint32; must(binary.Read(r, binary.LittleEndian, &v)); return v }
	u64 := func() uint64 { var v uint64; must(binary.Read(r, binary.LittleEndian, &v)); return v }
	str := func() string { b := make([]byte, u64()); _, err := r.Read(b); must(err); return string(b) }
	var value func(ty uint32) any
	value = func(ty uint32) any {
		switch ty {
		case typeUint32:
			return u32()
		case typeInt32:
			return int32(u32())
		case typeFloat32:
			return math.Float32frombits(u32())
		case typeBool:
			b, err := r.ReadByte()
			must(err)
			return b == 1
		case typeString:
			return str()
		case typeArray:
			et, n := u32(), u64()
			var out []any
			for range n {
				out = append(out, value(et))
			}
			return out
		}
		t.Fatalf("unknown value type %d", ty)
		return nil
	}
	p := parsed{kv: map[string]any{}, tensors: map[string]Tensor{}}
	for range hdr.Pairs {
		k := str()
		p.kv[k] = value(u32())
	}
	type info struct {
		t      Tensor
		offset uint64
	}
	var infos []info
	for range hdr.Tensors {
		var in info
		in.t.Name = str()
		for range u32() {
			in.t.Dims = append(in.t.Dims, u64())
		}
		in.t.Type, in.offset = u32(), u64()
		infos = append(infos, in)
		p.offsets = append(p.offsets, in.offset)
	}
	start := padded(uint64(len(data) - r.Len()))
	for i, in := range infos {
		size, err := typeSize(in.t.Type)
		must(err)
		n := uint64(size)
		for _, d := range in.t.Dims {
			n *= d
		}
		end := uint64(len(data)) - start
		if i+1 < len(infos) {
			end = infos[i+1].offset
		}
		if in.offset+n > end {
			t.Fatalf("tensor %s: %d bytes at %d overlap the next at %d", in.t.Name, n, in.offset, end)
		}
		in.t.Data = data[start+in.offset : start+in.offset+n]
		p.tensors[in.t.Name] = in.t
	}
	return p
}

func TestWriteReadBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.gguf")
	kvs := []KV{{"a.u", uint32(7)}, {"a.i", int32(-3)}, {"a.f", float32(0.5)}, {"a.b", true},
		{"a.s", "héllo"}, {"a.ai", []int32{1, -2}}, {"a.as", []string{"x", "", "yz"}}}
	tensors := []Tensor{
		{Name: "odd", Type: TypeBF16, Dims: []uint64{3}, Data: []byte{1, 2, 3, 4, 5, 6}},
		{Name: "m", Type: TypeF32, Dims: []uint64{2, 2}, Data: bytes.Repeat([]byte{9}, 16)},
	}
	if err := Write(path, kvs, tensors); err != nil {
		t.Fatal(err)
	}
	p := readGGUF(t, path)
	want := map[string]any{"a.u": uint32(7), "a.i": int32(-3), "a.f": float32(0.5), "a.b": true, "a.s": "héllo",
		"a.ai": []any{int32(1), int32(-2)}, "a.as": []any{"x", "", "yz"}}
	if fmt.Sprint(p.kv) != fmt.Sprint(want) {
		t.Errorf("metadata %v, want %v", p.kv, want)
	}
	for _, w := range tensors {
		got := p.tensors[w.Name]
		if got.Type != w.Type || !slices.Equal(got.Dims, w.Dims) || !bytes.Equal(got.Data, w.Data) {
			t.Errorf("tensor %s read back as %+v", w.Name, got)
		}
	}
	for _, off := range p.offsets {
		if off%alignment != 0 {
			t.Errorf("tensor offset %d not aligned to %d", off, alignment)
		}
	}
	if err := Write(path, nil, []Tensor{{Name: "bad", Type: TypeF32, Dims: []uint64{3}, Data: make([]byte, 8)}}); err == nil {
		t.Error("a tensor with the wrong byte count was written")
	}
}

// TestConvertQwen35 converts the tiny preset and checks the file against
// the checkpoint: names and dims llama.cpp's qwen35 loader asks for, the
// folded norms and A, and the value heads tiled over the key heads.
func TestConvertQwen35(t *testing.T) {
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 3, DType: "bf16"}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "tiny.gguf")
	if err := ConvertQwen35(dir, out); err != nil {
		t.Fatal(err)
	}
	g := readGGUF(t, out)
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	floats := func(name string) []float32 {
		tn, ok := ck.Tensor(name)
		if !ok {
			t.Fatalf("checkpoint lacks %s", name)
		}
		v, err := tn.Float32s()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	gf := func(name string) []float32 {
		tn, ok := g.tensors[name]
		if !ok || tn.Type != TypeF32 {
			t.Fatalf("GGUF lacks F32 tensor %s (%+v)", name, tn.Dims)
		}
		v := make([]float32, len(tn.Data)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(tn.Data[4*i:]))
		}
		return v
	}
	if g.kv["general.architecture"] != "qwen35" || g.kv["qwen35.block_count"] != uint32(p.Layers) ||
		g.kv["qwen35.full_attention_interval"] != uint32(p.FullEvery) || g.kv["qwen35.ssm.time_step_rank"] != uint32(p.LinearValueHeads) {
		t.Errorf("metadata %v", g.kv)
	}
	vocab := len(g.kv["tokenizer.ggml.tokens"].([]any))
	dims := map[string][]uint64{
		"token_embd.weight":                {uint64(p.Hidden), uint64(vocab)},
		"output.weight":                    {uint64(p.Hidden), uint64(vocab)},
		"blk.0.attn_qkv.weight":            {uint64(p.Hidden), uint64(2*p.LinearKeyHeads*p.LinearHeadDim + p.LinearValueHeads*p.LinearHeadDim)},
		"blk.0.ssm_conv1d.weight":          {uint64(p.ConvKernel), uint64(2*p.LinearKeyHeads*p.LinearHeadDim + p.LinearValueHeads*p.LinearHeadDim)},
		"blk.0.ssm_a":                      {uint64(p.LinearValueHeads)},
		"blk.0.ssm_out.weight":             {uint64(p.LinearValueHeads * p.LinearHeadDim), uint64(p.Hidden)},
		"blk.3.attn_q.weight":              {uint64(p.Hidden), uint64(2 * p.Heads * p.HeadDim)},
		"blk.3.attn_k_norm.weight":         {uint64(p.HeadDim)},
		"blk.3.ffn_down.weight":            {uint64(p.Intermediate), uint64(p.Hidden)},
		"blk.3.post_attention_norm.weight": {uint64(p.Hidden)},
	}
	for name, want := range dims {
		if got := g.tensors[name].Dims; !slices.Equal(got, want) {
			t.Errorf("%s dims %v, want %v", name, got, want)
		}
	}
	if vocab >= p.VocabSize || vocab < 256 {
		t.Errorf("vocabulary of %d tokens: want the tokenizer's ids, not the %d padded rows", vocab, p.VocabSize)
	}
	hf := "model.language_model.layers."
	for i, w := range floats(hf + "0.input_layernorm.weight") {
		if got := gf("blk.0.attn_norm.weight")[i]; got != 1+w {
			t.Fatalf("attn_norm[%d] = %v, want 1+%v", i, got, w)
		}
	}
	hk, hv, ratio := p.LinearKeyHeads, p.LinearValueHeads, p.LinearValueHeads/p.LinearKeyHeads
	aLog, ssmA := floats(hf+"0.linear_attn.A_log"), gf("blk.0.ssm_a")
	seen := map[int]bool{}
	for h := range hv {
		// GGUF head h must be the checkpoint head that reads key head h mod hk
		// (llama.cpp's broadcast); the checkpoint's head src reads key head src/ratio.
		src := slices.IndexFunc(aLog, func(a float32) bool {
			return math.Abs(-math.Exp(float64(a))-float64(ssmA[h])) < 1e-6*math.Exp(float64(a))
		})
		if src < 0 || src/ratio != h%hk || seen[src] {
			t.Fatalf("GGUF value head %d is checkpoint head %d (A_log %v, ssm_a %v)", h, src, aLog, ssmA)
		}
		seen[src] = true
	}
}
