package main

import (
	"flag"
	"fmt"

	"ddflash/engine/fp8"
)

func init() {
	register("quantize", "write the FP8 (block-scaled E4M3) form of a bf16 checkpoint, in Qwen's -FP8 layout", runQuantize)
}

func runQuantize(args []string) error {
	fs := flag.NewFlagSet("quantize", flag.ContinueOnError)
	in := fs.String("in", "", "unquantised checkpoint directory (required)")
	out := fs.String("out", "", "directory to write the FP8 checkpoint into (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || *out == "" {
		return fmt.Errorf("--in and --out are required")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := fp8.QuantizeCheckpoint(*in, *out); err != nil {
		return err
	}
	fmt.Printf("wrote the FP8 form of %s to %s\n", *in, *out)
	return nil
}
