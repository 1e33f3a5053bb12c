package main

import (
	"flag"
	"fmt"

	"ddflash/engine/gguf"
)

func init() {
	register("gguf", "convert a checkpoint to a GGUF file for llama.cpp (qwen35 architecture)", runGGUF)
}

func runGGUF(args []string) error {
	fs := flag.NewFlagSet("gguf", flag.ContinueOnError)
	model := fs.String("model", "", "checkpoint directory (config.json, safetensors, tokenizer.json) (required)")
	out := fs.String("out", "", "GGUF file to write (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *model == "" || *out == "" {
		return fmt.Errorf("--model and --out are required")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := gguf.ConvertQwen35(*model, *out); err != nil {
		return err
	}
	fmt.Printf("wrote %s\n", *out)
	return nil
}
