package planner

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"ddflash/dflash"
	"ddflash/engine/config"
)

// presets holds the built-in config.json files, written from the values in
// docs/qwen36-model.md §1 and docs/dflash-ddtree.md §1.1.
//
//go:embed presets/*.json
var presets embed.FS

// Target is a target model as the planner needs it.
type Target struct {
	Name   string
	Config *config.Config
	Vision Vision // zero when the checkpoint has no vision tower
}

// Vision describes the checkpoint's vision tower: SGLang loads it and shrinks
// its memory fraction for it; ddflash is text-only and skips it.
type Vision struct {
	Layers int
	Hidden int
	Params int64
}

// TargetPresets and DrafterPresets list the built-in model names.
func TargetPresets() []string { return presetNames(false) }

// DrafterPresets lists the built-in drafter names.
func DrafterPresets() []string { return presetNames(true) }

// isDrafterPreset reports whether a preset is a drafter (qwen3.6-27b-dflash,
// qwen3.8-27b-dflash2) rather than a target.
func isDrafterPreset(name string) bool {
	return strings.HasSuffix(name, "-dflash") || strings.HasSuffix(name, "-dflash2")
}

func presetNames(drafters bool) []string {
	entries, _ := fs.ReadDir(presets, "presets")
	var names []string
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".json")
		if isDrafterPreset(name) == drafters {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// readConfig returns a preset's config.json or DIR/config.json.
func readConfig(ref string, names []string) (string, []byte, error) {
	for _, n := range names {
		if strings.EqualFold(ref, n) {
			data, err := presets.ReadFile("presets/" + n + ".json")
			return n, data, err
		}
	}
	path := filepath.Join(ref, "config.json")
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil, fmt.Errorf("%q is neither a built-in model (%s) nor a directory with a config.json", ref, strings.Join(names, ", "))
	}
	if err != nil {
		return "", nil, err
	}
	return ref, data, nil
}

// LoadTarget reads a built-in target model by name, or DIR/config.json.
func LoadTarget(ref string) (*Target, error) {
	name, data, err := readConfig(ref, TargetPresets())
	if err != nil {
		return nil, fmt.Errorf("target model: %w", err)
	}
	c, err := config.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("target model %s: %w", name, err)
	}
	v, err := parseVision(data)
	if err != nil {
		return nil, fmt.Errorf("target model %s: %w", name, err)
	}
	return &Target{Name: name, Config: c, Vision: v}, nil
}

// LoadDrafter reads a built-in DFlash drafter by name, or DIR/config.json.
func LoadDrafter(ref string) (*dflash.Config, error) {
	name, data, err := readConfig(ref, DrafterPresets())
	if err != nil {
		return nil, fmt.Errorf("drafter: %w", err)
	}
	c, err := dflash.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("drafter %s: %w", name, err)
	}
	return c, nil
}

// parseVision reads vision_config of a Qwen3.5/3.6 checkpoint.
func parseVision(data []byte) (Vision, error) {
	var top struct {
		Vision *struct {
			Depth        *int `json:"depth"`
			Hidden       *int `json:"hidden_size"`
			MLP          *int `json:"intermediate_size"`
			InChannels   *int `json:"in_channels"`
			Patch        *int `json:"patch_size"`
			TemporalPat  *int `json:"temporal_patch_size"`
			SpatialMerge *int `json:"spatial_merge_size"`
			OutHidden    *int `json:"out_hidden_size"`
			Positions    *int `json:"num_position_embeddings"`
		} `json:"vision_config"`
	}
	if err := json.Unmarshal(data, &top); err != nil {
		return Vision{}, fmt.Errorf("vision_config: %w", err)
	}
	v := top.Vision
	if v == nil {
		return Vision{}, nil
	}
	three := 3
	if v.InChannels == nil {
		v.InChannels = &three
	}
	dims := []struct {
		name string
		v    *int
	}{
		{"depth", v.Depth}, {"hidden_size", v.Hidden}, {"intermediate_size", v.MLP},
		{"in_channels", v.InChannels}, {"patch_size", v.Patch}, {"temporal_patch_size", v.TemporalPat},
		{"spatial_merge_size", v.SpatialMerge}, {"out_hidden_size", v.OutHidden},
		{"num_position_embeddings", v.Positions},
	}
	for _, d := range dims {
		if d.v == nil || *d.v <= 0 {
			return Vision{}, fmt.Errorf("field vision_config.%s: missing or not positive", d.name)
		}
	}
	tower := visionTower{
		layers: int64(*v.Depth), hidden: int64(*v.Hidden), mlp: int64(*v.MLP),
		patchInputs: int64(*v.InChannels * *v.TemporalPat * *v.Patch * *v.Patch),
		merge:       int64(*v.SpatialMerge), out: int64(*v.OutHidden), positions: int64(*v.Positions),
	}
	return Vision{Layers: *v.Depth, Hidden: *v.Hidden, Params: tower.params()}, nil
}

// visionTower is the Qwen3-VL style ViT: a conv patch embedding, learned
// positions, pre-norm blocks with biases, and a merger MLP over
// spatial_merge² neighbouring patches.
type visionTower struct {
	layers, hidden, mlp, patchInputs, merge, out, positions int64
}

func (t visionTower) params() int64 {
	h := t.hidden
	patchEmbed := t.patchInputs*h + h
	block := 2*2*h + // two LayerNorms, weight and bias
		h*3*h + 3*h + // qkv
		h*h + h + // proj
		h*t.mlp + t.mlp + t.mlp*h + h // fc1, fc2
	merged := h * t.merge * t.merge
	merger := 2*h + merged*merged + merged + merged*t.out + t.out
	return patchEmbed + t.positions*h + t.layers*block + merger
}

// textParams counts the target's text-model parameters: embedding, LM head
// (unless tied), final norm, and per layer two norms, the SwiGLU MLP and
// either gated full attention or a Gated DeltaNet mixer.
func textParams(c *config.Config) int64 {
	h := int64(c.HiddenSize)
	embed := int64(c.VocabSize) * h
	total := embed + h
	if !c.TieWordEmbeddings {
		total += embed
	}
	hd := int64(c.HeadDim)
	qOut := int64(c.NumHeads) * hd
	if c.AttnOutputGate {
		qOut *= 2 // q_proj emits a gate per head
	}
	fullAttention := h*qOut + 2*h*int64(c.NumKVHeads)*hd + int64(c.NumHeads)*hd*h + 2*hd
	conv, value, vHeads := int64(c.ConvDim()), int64(c.ValueDim()), int64(c.LinearValueHeads)
	gdn := h*conv + h*value + 2*h*vHeads + // in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
		conv*int64(c.ConvKernel) + 2*vHeads + int64(c.LinearValueDim) + // conv1d, dt_bias, A_log, norm
		value*h // out_proj
	perLayer := 3*h*int64(c.IntermediateSize) + 2*h
	for _, kind := range c.Layers {
		total += perLayer
		if kind == config.Full {
			total += fullAttention
		} else {
			total += gdn
		}
	}
	return total
}

// dtypeBytes is the element size of a checkpoint dtype; configs that do not
// say are bf16, as every Qwen3.5/3.6 release is.
func dtypeBytes(dtype string) int {
	if dtype == "float32" {
		return 4
	}
	return 2
}
