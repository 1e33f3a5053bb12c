package fp8

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"ddflash/engine/config"
	"ddflash/engine/safetensors"
)

// QuantizeCheckpoint writes to out the FP8 form of the unquantised
// checkpoint in dir: its linear layers (but those Qwen keeps in bf16, see
// QwenNotConverted) as F8_E4M3 with block scales, everything else as it
// is, config.json with quantization_config, and every other file copied.
// It converts one safetensors file at a time, keeping the shard layout.
func QuantizeCheckpoint(dir, out string) error {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return fmt.Errorf("read model config: %w", err)
	}
	cfg, err := config.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, "config.json"), err)
	}
	if cfg.Quant != nil {
		return fmt.Errorf("%s: already quantised (config.json has a quantization_config)", dir)
	}
	if in, _ := filepath.Abs(dir); in == absPath(out) {
		return fmt.Errorf("output directory %s: must differ from the input", out)
	}
	ckpt, err := safetensors.Open(dir)
	if err != nil {
		return err
	}
	defer ckpt.Close()
	prefix := "model."
	byFile := map[string][]safetensors.Tensor{}
	for _, name := range ckpt.Names() {
		t, _ := ckpt.Tensor(name)
		byFile[t.File] = append(byFile[t.File], t)
		if strings.HasPrefix(name, "model.language_model.") {
			prefix = "model.language_model."
		}
	}
	quant := &config.Quantization{NotConverted: QwenNotConverted(cfg.Layers, prefix)}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	weightMap := map[string]string{}
	files := make([]string, 0, len(byFile))
	for f := range byFile {
		files = append(files, f)
	}
	slices.Sort(files)
	for _, f := range files {
		converted, err := Convert(byFile[f], quant)
		if err != nil {
			return err
		}
		name := filepath.Base(f)
		if err := safetensors.Write(filepath.Join(out, name), converted, map[string]string{"format": "pt"}); err != nil {
			return err
		}
		for _, t := range converted {
			weightMap[t.Name] = name
		}
	}
	if _, err := os.Stat(filepath.Join(dir, safetensors.IndexFile)); err == nil {
		index, _ := json.MarshalIndent(map[string]any{"weight_map": weightMap}, "", "  ")
		if err := os.WriteFile(filepath.Join(out, safetensors.IndexFile), append(index, '\n'), 0o644); err != nil {
			return err
		}
	}
	if err := copyOtherFiles(dir, out); err != nil {
		return err
	}
	var top map[string]any
	if err := json.Unmarshal(raw, &top); err != nil {
		return err
	}
	top["quantization_config"] = ConfigJSON(quant.NotConverted)
	js, err := json.MarshalIndent(top, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "config.json"), append(js, '\n'), 0o644)
}

// copyOtherFiles copies the regular files of dir other than the weights
// and config.json (tokenizer, generation config, chat template, ...).
func copyOtherFiles(dir, out string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || name == "config.json" || name == safetensors.IndexFile || strings.HasSuffix(name, ".safetensors") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func absPath(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return abs
}
