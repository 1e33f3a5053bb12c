package testmodel

import (
	"bytes"
	"encoding/json"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/engine/config"
	"ddflash/engine/safetensors"
	"ddflash/internal/closeness"
	"ddflash/kernels/cpu"
)

func tiny(t *testing.T) Preset {
	t.Helper()
	p, err := PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func write(t *testing.T, opt Options) string {
	t.Helper()
	dir := t.TempDir()
	if err := Write(dir, opt); err != nil {
		t.Fatalf("Write(%+v): %v", opt, err)
	}
	return dir
}

type tokenizerFile struct {
	AddedTokens []struct {
		ID      int    `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	Model struct {
		Type   string         `json:"type"`
		Vocab  map[string]int `json:"vocab"`
		Merges [][2]string    `json:"merges"`
	} `json:"model"`
}

func readTokenizer(t *testing.T, dir string) tokenizerFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tf tokenizerFile
	if err := json.Unmarshal(raw, &tf); err != nil {
		t.Fatalf("tokenizer.json: %v", err)
	}
	return tf
}

func TestWriteLoadsWithConfigAndLoader(t *testing.T) {
	p := tiny(t)
	for _, opt := range []Options{
		{Preset: p, Seed: 1, DType: "f32"},
		{Preset: p, Seed: 1, DType: "bf16"},
		{Preset: p, Seed: 1, DType: "f32", Shards: 3},
		{Preset: p, Seed: 1, DType: "bf16", Shards: 2},
	} {
		dir := write(t, opt)
		cfg, err := config.Load(dir)
		if err != nil {
			t.Fatalf("%+v: config.Load: %v", opt, err)
		}
		tf := readTokenizer(t, dir)
		ids := map[string]int{}
		for _, a := range tf.AddedTokens {
			ids[a.Content] = a.ID
		}
		if cfg.HiddenSize != p.Hidden || cfg.NumLayers != p.Layers || cfg.VocabSize != p.VocabSize ||
			cfg.NumHeads != p.Heads || cfg.NumKVHeads != p.KVHeads || cfg.RotaryDim() != 4 ||
			cfg.ConvDim() != 2*2*16+4*16 || cfg.TieWordEmbeddings || !cfg.AttnOutputGate {
			t.Errorf("config.json parsed to %+v", cfg)
		}
		// The real 3:1 pattern: layers 3, 7, ... are full attention.
		if want := []config.LayerKind{config.Linear, config.Linear, config.Linear, config.Full}; !slices.Equal(cfg.Layers, want) {
			t.Errorf("layer kinds %v, want %v", cfg.Layers, want)
		}
		if want := []int{ids["<|im_end|>"], ids["<|endoftext|>"]}; !slices.Equal(cfg.EOSTokenIDs, want) {
			t.Errorf("eos ids %v, want %v (<|im_end|>, <|endoftext|>)", cfg.EOSTokenIDs, want)
		}
		w, err := engine.LoadWeights(cpu.New(1), dir, cfg)
		if err != nil {
			t.Fatalf("%+v: LoadWeights: %v", opt, err)
		}
		if len(w.Layers) != p.Layers || w.LMHead == w.Embed {
			t.Errorf("%+v: loaded %d layers, lm_head tied: %v", opt, len(w.Layers), w.LMHead == w.Embed)
		}
	}
}

func TestWriteIsDeterministicPerSeed(t *testing.T) {
	p := tiny(t)
	files := func(dir string) map[string][]byte {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]byte{}
		for _, e := range entries {
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			out[e.Name()] = data
		}
		return out
	}
	a := files(write(t, Options{Preset: p, Seed: 5, DType: "bf16", Shards: 2}))
	b := files(write(t, Options{Preset: p, Seed: 5, DType: "bf16", Shards: 2}))
	c := files(write(t, Options{Preset: p, Seed: 6, DType: "bf16", Shards: 2}))
	if len(a) != 7 {
		t.Errorf("wrote %d files, want 7 (config, generation config, 2 shards, index, 2 tokenizer files)", len(a))
	}
	for name, data := range a {
		if !bytes.Equal(data, b[name]) {
			t.Errorf("%s differs between two writes with seed 5", name)
		}
		isWeights := strings.HasSuffix(name, ".safetensors")
		if same := bytes.Equal(data, c[name]); isWeights == same {
			t.Errorf("%s: identical for seeds 5 and 6: %v (want %v)", name, same, !isWeights)
		}
	}
}

// TestInitScales checks the random init that keeps a random model's greedy
// decoding from collapsing: unit-scale activations, decays in (0,1), and
// lm_head padding rows that dominate unless masked.
func TestInitScales(t *testing.T) {
	p := tiny(t)
	dir := write(t, Options{Preset: p, Seed: 3, DType: "f32"})
	ckpt, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	values := func(name string) []float32 {
		tensor, ok := ckpt.Tensor(name)
		if !ok {
			t.Fatalf("missing %s", name)
		}
		v, err := tensor.Float32s()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	stats := func(v []float32) (mean, std float64) {
		for _, x := range v {
			mean += float64(x)
		}
		mean /= float64(len(v))
		for _, x := range v {
			std += (float64(x) - mean) * (float64(x) - mean)
		}
		return mean, math.Sqrt(std / float64(len(v)))
	}
	within := func(name string, got, want, tol float64) {
		if !closeness.Near(got, want, tol*want) {
			t.Errorf("%s: %.4f, want %.4f ±%.0f%%", name, got, want, 100*tol)
		}
	}
	l := TextPrefix + "layers."
	_, std := stats(values(l + "0.mlp.down_proj.weight"))
	within("down_proj std", std, 1/math.Sqrt(float64(p.Intermediate)), 0.05)
	_, std = stats(values(l + "3.self_attn.q_proj.weight"))
	within("q_proj std", std, 1/math.Sqrt(float64(p.Hidden)), 0.05)
	_, std = stats(values(TextPrefix + "embed_tokens.weight"))
	within("embedding std", std, 1, 0.05)
	mean, _ := stats(values(l + "0.linear_attn.norm.weight"))
	within("plain GDN norm mean", mean, 1, 0.1)

	for _, a := range values(l + "1.linear_attn.A_log") {
		if a < 0 || float64(a) > math.Log(16) {
			t.Errorf("A_log %g outside [0, log 16]", a)
		}
	}
	for _, b := range values(l + "1.linear_attn.dt_bias") {
		if dt := math.Log1p(math.Exp(float64(b))); dt < 0.999e-3 || dt > 1.001e-1 {
			t.Errorf("softplus(dt_bias) = %g outside [1e-3, 1e-1]", dt)
		}
	}

	used := len(readTokenizer(t, dir).Model.Vocab) + len(SpecialTokens)
	head := values("lm_head.weight")
	_, realStd := stats(head[:used*p.Hidden])
	_, padStd := stats(head[used*p.Hidden:])
	within("lm_head real-row logit spread", realStd*math.Sqrt(float64(p.Hidden)), logitSpread, 0.1)
	within("lm_head padding/real ratio", padStd/realStd, padLogitBoost, 0.15)
}

func TestTokenizerFile(t *testing.T) {
	p := tiny(t)
	dir := write(t, Options{Preset: p, Seed: 1})
	tf := readTokenizer(t, dir)
	if tf.Model.Type != "BPE" || len(tf.Model.Merges) != p.MaxMerges {
		t.Fatalf("model %s with %d merges, want BPE with %d", tf.Model.Type, len(tf.Model.Merges), p.MaxMerges)
	}
	// GPT-2 byte-level ids shared by the Qwen vocabularies: '!' is 0,
	// '\n' (Ċ) is 198, ' ' (Ġ) is 220, 'A' is 32.
	for tok, id := range map[string]int{"!": 0, "Ċ": 198, "Ġ": 220, "A": 32} {
		if tf.Model.Vocab[tok] != id {
			t.Errorf("byte token %q has id %d, want %d", tok, tf.Model.Vocab[tok], id)
		}
	}
	ids := map[int]bool{}
	for tok, id := range tf.Model.Vocab {
		if ids[id] {
			t.Errorf("id %d used twice (%q)", id, tok)
		}
		ids[id] = true
	}
	for i, m := range tf.Model.Merges {
		_, okA := tf.Model.Vocab[m[0]]
		_, okB := tf.Model.Vocab[m[1]]
		if id, ok := tf.Model.Vocab[m[0]+m[1]]; !okA || !okB || !ok || id < 256 {
			t.Errorf("merge %d %q: parts or result missing from the vocabulary", i, m)
		}
	}
	n := len(tf.Model.Vocab)
	for i, a := range tf.AddedTokens {
		if a.ID != n+i || a.Content != SpecialTokens[i] || !a.Special {
			t.Errorf("added token %d = %+v, want %q with id %d", i, a, SpecialTokens[i], n+i)
		}
	}
	if total := n + len(tf.AddedTokens); total >= p.VocabSize {
		t.Errorf("tokenizer has %d ids, vocab_size %d leaves no padding", total, p.VocabSize)
	}
	var tc struct {
		EOS          string `json:"eos_token"`
		ChatTemplate string `json:"chat_template"`
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err := json.Unmarshal(raw, &tc); err != nil || tc.EOS != "<|im_end|>" || !strings.Contains(tc.ChatTemplate, "<|im_start|>") {
		t.Errorf("tokenizer_config.json: %+v %v", tc, err)
	}
}

func TestWriteRejectsBadOptions(t *testing.T) {
	p := tiny(t)
	if err := Write(t.TempDir(), Options{Preset: p, DType: "f16"}); err == nil || !strings.Contains(err.Error(), "f16") {
		t.Errorf("dtype f16: err = %v", err)
	}
	if err := Write(t.TempDir(), Options{}); err == nil {
		t.Error("empty preset accepted")
	}
	if _, err := PresetByName("huge"); err == nil || !strings.Contains(err.Error(), "tiny") {
		t.Errorf("unknown preset: err = %v", err)
	}
	small := p
	small.VocabSize = 100
	if err := Write(t.TempDir(), Options{Preset: small}); err == nil || !strings.Contains(err.Error(), "vocab_size") {
		t.Errorf("vocab_size below the tokenizer: err = %v", err)
	}
}

// TestDrafterLayerTypes writes drafters of several layouts and reads them
// back with the drafter's config parser: the layer kinds, in order, and a
// tensor count the layer count needs; bad layouts are refused.
func TestDrafterLayerTypes(t *testing.T) {
	p := tiny(t)
	S, F := dflash.SlidingAttention, dflash.FullAttention
	for _, c := range []struct {
		opt  DraftOptions
		want []dflash.LayerKind
	}{
		{DraftOptions{}, []dflash.LayerKind{S, F}},
		{DraftOptions{Layers: 3}, []dflash.LayerKind{S, S, F}},
		{DraftOptions{LayerTypes: []string{"sliding", "sliding_attention", "sliding", "sliding", "full"}}, []dflash.LayerKind{S, S, S, S, F}},
		{DraftOptions{Layers: 3, LayerTypes: []string{"full", "sliding", "full_attention"}}, []dflash.LayerKind{F, S, F}},
		{DraftOptions{LayerTypes: []string{"sliding", "sliding"}, Window: 12}, []dflash.LayerKind{S, S}},
		{DraftOptions{LayerTypes: []string{"full"}}, []dflash.LayerKind{F}},
	} {
		c.opt.Target, c.opt.Seed = p, 1
		dir := t.TempDir()
		if err := WriteDrafter(dir, c.opt); err != nil {
			t.Fatalf("%+v: %v", c.opt, err)
		}
		cfg, err := dflash.LoadConfig(dir)
		if err != nil {
			t.Fatalf("%+v: %v", c.opt, err)
		}
		if !slices.Equal(cfg.Layers, c.want) {
			t.Errorf("%v: layers %v, want %v", c.opt.LayerTypes, cfg.Layers, c.want)
		}
		if c.opt.Window != 0 && cfg.SlidingWindow != c.opt.Window {
			t.Errorf("%v: window %d, want %d", c.opt.LayerTypes, cfg.SlidingWindow, c.opt.Window)
		}
		f, err := safetensors.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		// fc, hidden_norm and norm, and 11 tensors per layer.
		if n := len(f.Names()); n != 3+11*len(c.want) {
			t.Errorf("%v: %d tensors for %d layers, want %d", c.opt.LayerTypes, n, len(c.want), 3+11*len(c.want))
		}
		f.Close()
	}
	for _, bad := range []DraftOptions{
		{LayerTypes: []string{"sliding", "linear_attention"}},
		{Layers: 2, LayerTypes: []string{"sliding", "sliding", "full"}},
		{LayerTypes: []string{}},
		{Layers: -1},
	} {
		bad.Target = p
		if err := WriteDrafter(t.TempDir(), bad); err == nil {
			t.Errorf("layers %d, types %q: accepted", bad.Layers, bad.LayerTypes)
		}
	}
}

// TestDrafterWidthAndTaps writes a drafter narrower than its target with
// its own tap layers, as the demo pair's (one layer, SwiGLU half the
// target's, taps on target layers 1 and 3): the config says so and the
// tensors have the shapes it implies.
func TestDrafterWidthAndTaps(t *testing.T) {
	p := tiny(t)
	dir := t.TempDir()
	opt := DraftOptions{Target: p, Seed: 1, LayerTypes: []string{"full"}, Intermediate: p.Intermediate / 2, Taps: []int{1, 3}}
	if err := WriteDrafter(dir, opt); err != nil {
		t.Fatal(err)
	}
	cfg, err := dflash.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.IntermediateSize != p.Intermediate/2 || !slices.Equal(cfg.TargetLayerIDs, []int{1, 3}) {
		t.Errorf("config: intermediate %d, taps %v; want %d, [1 3]", cfg.IntermediateSize, cfg.TargetLayerIDs, p.Intermediate/2)
	}
	f, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, want := range map[string][]int{
		"fc.weight":                     {p.Hidden, 2 * p.Hidden},
		"layers.0.mlp.gate_proj.weight": {p.Intermediate / 2, p.Hidden},
		"layers.0.mlp.down_proj.weight": {p.Hidden, p.Intermediate / 2},
	} {
		if tensor, ok := f.Tensor(name); !ok || !slices.Equal(tensor.Shape, want) {
			t.Errorf("%s: shape %v (present %v), want %v", name, tensor.Shape, ok, want)
		}
	}
	for _, taps := range [][]int{{-1}, {p.Layers}} {
		bad := opt
		bad.Taps = taps
		if err := WriteDrafter(t.TempDir(), bad); err == nil {
			t.Errorf("taps %v of a %d-layer target: accepted", taps, p.Layers)
		}
	}
}

// BenchmarkWriteAndLoadSmall measures generating the small preset and
// loading it onto the CPU backend (about 115M parameters in bf16).
func BenchmarkWriteAndLoadSmall(b *testing.B) {
	p, err := PresetByName("small")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	b.Run("write", func(b *testing.B) {
		for b.Loop() {
			if err := Write(dir, Options{Preset: p, Seed: 1, DType: "bf16"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	cfg, err := config.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	be := cpu.New(0)
	b.Run("load", func(b *testing.B) {
		for b.Loop() {
			if _, err := engine.LoadWeights(be, dir, cfg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestMTPLayout: with MTP, the checkpoint holds exactly the mtp.* tensors
// of Qwen3.6-27B's published index (engine/testdata/qwen3.6-27b), its
// config declares one MTP layer, and the target still loads without them;
// without MTP it has none, and the random text model is the same.
func TestMTPLayout(t *testing.T) {
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	data, err := os.ReadFile("../testdata/qwen3.6-27b/model.safetensors.index.derived.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &index); err != nil {
		t.Fatal(err)
	}
	mtpNames := func(names []string) []string {
		var out []string
		for _, n := range names {
			if strings.HasPrefix(n, "mtp.") {
				out = append(out, n)
			}
		}
		slices.Sort(out)
		return out
	}
	want := mtpNames(slices.Collect(maps.Keys(index.WeightMap)))
	p := tiny(t)
	with, without := write(t, Options{Preset: p, Seed: 2, MTP: true}), write(t, Options{Preset: p, Seed: 2})
	for _, c := range []struct {
		dir    string
		layers int
		names  []string
	}{{with, 1, want}, {without, 0, nil}} {
		ckpt, err := safetensors.Open(c.dir)
		if err != nil {
			t.Fatal(err)
		}
		got := mtpNames(ckpt.Names())
		ckpt.Close()
		if !slices.Equal(got, c.names) {
			t.Errorf("mtp tensors %v, want the published %v", got, c.names)
		}
		cfg, err := config.Load(c.dir)
		if err != nil || cfg.MTPLayers != c.layers {
			t.Fatalf("mtp_num_hidden_layers %d (%v), want %d", cfg.MTPLayers, err, c.layers)
		}
		if _, err := engine.LoadWeights(cpu.New(1), c.dir, cfg); err != nil {
			t.Errorf("the target beside its MTP head: %v", err)
		}
	}
	a, err := safetensors.Open(with)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := safetensors.Open(without)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, name := range b.Names() {
		ta, _ := a.Tensor(name)
		tb, _ := b.Tensor(name)
		if !bytes.Equal(ta.Data, tb.Data) {
			t.Fatalf("%s differs with and without the MTP head: the head must come after the target in the random stream", name)
		}
	}
}
