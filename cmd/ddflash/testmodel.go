package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"ddflash/engine/testmodel"
)

func init() {
	register("testmodel", "write a random Qwen3.6-architecture checkpoint for tests and benchmarks", runTestModel)
}

func runTestModel(args []string) error {
	names := make([]string, len(testmodel.Presets))
	for i, p := range testmodel.Presets {
		names[i] = p.Name
	}
	fs := flag.NewFlagSet("testmodel", flag.ContinueOnError)
	out := fs.String("out", "", "directory to write the target model into (required)")
	preset := fs.String("preset", "tiny", "model size: "+strings.Join(names, "|"))
	seed := fs.Uint64("seed", 1, "random seed; the same seed gives identical files")
	dtype := fs.String("dtype", "f32", "weight dtype: f32|bf16|fp8 (fp8: bf16 with FP8 block-scaled linear layers, as Qwen's -FP8 checkpoints; the drafter stays bf16)")
	shards := fs.Int("shards", 1, "number of safetensors files (more than 1 adds model.safetensors.index.json)")
	mtp := fs.Bool("mtp", false, "also write the multi-token-prediction head (mtp.*, as every Qwen3.5/3.6/3.8 checkpoint ships it), for --spec mtp")
	draftOut := fs.String("draft-out", "", "also write a matching random DFlash drafter (z-lab layout) into this directory")
	draftLayers := fs.Int("draft-layers", 0, "drafter layers (default: as many as --draft-layer-types lists, or 2)")
	draftLayerTypes := fs.String("draft-layer-types", "", "drafter layer_types in order, comma-separated: sliding|full (default: the last layer full, the others sliding; z-lab's Qwen3.6-27B drafter is sliding,sliding,sliding,sliding,full)")
	draftWindow := fs.Int("draft-window", 0, "sliding window of the drafter's sliding layers (default: 3/4 of the target's context)")
	draftIntermediate := fs.Int("draft-intermediate", 0, "the drafter's SwiGLU width (default: the target's)")
	draftBlock := fs.Int("draft-block", 0, "the drafter's block size (default 16, as the published drafters)")
	draftV2 := fs.Bool("draft-dflash2", false, "write the drafter as DFlash2 (published layout: grouped dynamic convolutions and the candidate selector; conv_kernel_size 2, selector_top_k 16)")
	draftTaps := fs.String("draft-taps", "", "target layers the drafter takes in, comma-separated (default: one per drafter layer, spread over the target, the last included)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("--out is required (the directory to write the model into)")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	p, err := testmodel.PresetByName(*preset)
	if err != nil {
		return err
	}
	if *shards < 1 {
		return fmt.Errorf("--shards %d: need at least 1", *shards)
	}
	opt := testmodel.Options{Preset: p, Seed: *seed, DType: *dtype, Shards: *shards, MTP: *mtp}
	if err := testmodel.Write(*out, opt); err != nil {
		return err
	}
	fmt.Printf("wrote %s test model (seed %d, %s, %d shard(s)) to %s\n", p.Name, *seed, *dtype, *shards, *out)
	if *draftOut == "" {
		return nil
	}
	draftDType := *dtype
	if draftDType == "fp8" { // drafters ship unquantised
		draftDType = "bf16"
	}
	var layerTypes []string
	if *draftLayerTypes != "" {
		layerTypes = strings.Split(*draftLayerTypes, ",")
	}
	var taps []int
	if *draftTaps != "" {
		for _, field := range strings.Split(*draftTaps, ",") {
			layer, err := strconv.Atoi(strings.TrimSpace(field))
			if err != nil {
				return fmt.Errorf("--draft-taps %q: %w", *draftTaps, err)
			}
			taps = append(taps, layer)
		}
	}
	draft := testmodel.DraftOptions{Target: p, Seed: *seed, DType: draftDType, Layers: *draftLayers, LayerTypes: layerTypes, Window: *draftWindow,
		Intermediate: *draftIntermediate, Taps: taps, BlockSize: *draftBlock, DFlash2: *draftV2}
	if err := testmodel.WriteDrafter(*draftOut, draft); err != nil {
		return err
	}
	kind := "DFlash"
	if *draftV2 {
		kind = "DFlash2"
	}
	fmt.Printf("wrote a matching %s drafter to %s\n", kind, *draftOut)
	return nil
}
