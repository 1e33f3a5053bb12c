package engine

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"ddflash/engine/testmodel"
	"ddflash/kernels/cpu"
)

// TestLoadGenerationConfigQwen reads Qwen3.6-27B's generation_config.json
// (testdata/qwen3.6-27b/SOURCE says where it comes from).
func TestLoadGenerationConfigQwen(t *testing.T) {
	g, found, err := LoadGenerationConfig("testdata/qwen3.6-27b")
	if err != nil || !found {
		t.Fatalf("found %v, err %v", found, err)
	}
	if !slices.Equal(g.EOS, []int32{248046, 248044}) {
		t.Errorf("eos %v, want [248046 248044]", g.EOS)
	}
	if g.Temperature == nil || *g.Temperature != 1 || g.TopP == nil || *g.TopP != 0.95 || g.TopK == nil || *g.TopK != 20 {
		t.Errorf("defaults %+v, want temperature 1, top_p 0.95, top_k 20", g)
	}
	if g.MinP != nil || g.RepetitionPenalty != nil {
		t.Errorf("min_p %v, repetition_penalty %v: the file has neither", g.MinP, g.RepetitionPenalty)
	}
}

// TestEngineLoadsGenerationConfig: the file's eos ids join the stop set
// (one id or a list), its defaults are kept on the engine, a checkpoint
// without it has none, and a malformed file or an id outside the
// vocabulary fails the load naming the file.
func TestEngineLoadsGenerationConfig(t *testing.T) {
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 1, DType: "f32"}); err != nil {
		t.Fatal(err)
	}
	load := func(gen string) (*Engine, error) {
		path := filepath.Join(dir, "generation_config.json")
		os.Remove(path)
		if gen != "" {
			if err := os.WriteFile(path, []byte(gen), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return Load(cpu.New(1), dir, Options{Context: 16})
	}
	base, err := load("")
	if err != nil {
		t.Fatal(err)
	}
	if base.Generation != nil {
		t.Fatalf("no generation_config.json, yet Generation = %+v", base.Generation)
	}
	for _, c := range []struct {
		file string
		add  []int32
	}{
		{`{"eos_token_id": [250, 3], "top_k": 20}`, []int32{250, 3}},
		{`{"eos_token_id": 251}`, []int32{251}},
	} {
		e, err := load(c.file)
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(base.EOS)
		for _, id := range c.add {
			if !slices.Contains(want, id) {
				want = append(want, id)
			}
		}
		if !slices.Equal(e.EOS, want) {
			t.Errorf("%s: EOS %v, want %v", c.file, e.EOS, want)
		}
		if e.Generation == nil || !slices.Equal(e.Generation.EOS, c.add) {
			t.Errorf("%s: Generation %+v", c.file, e.Generation)
		}
	}
	e, err := load(`{"temperature": 0.6, "min_p": 0.05, "repetition_penalty": 1.05}`)
	if err != nil {
		t.Fatal(err)
	}
	if g := e.Generation; *g.Temperature != 0.6 || *g.MinP != 0.05 || *g.RepetitionPenalty != 1.05 || g.TopP != nil || !slices.Equal(e.EOS, base.EOS) {
		t.Errorf("sampling defaults not kept as written: %+v, EOS %v", g, e.EOS)
	}
	for _, bad := range []string{`{"eos_token_id": "x"}`, `{"temperature": }`, `{"eos_token_id": [999999]}`} {
		if _, err := load(bad); err == nil {
			t.Errorf("%s loaded", bad)
		} else {
			t.Logf("%s: %v", bad, err)
		}
	}
}
