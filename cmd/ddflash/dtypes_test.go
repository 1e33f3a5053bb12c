package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/kernels"
)

// TestCacheDtypesFollowTheCheckpoint: with no dtype flags, plan names the
// checkpoint's dtype for the KV cache and the conv state (fp32 for an f32
// checkpoint, bf16 for a bf16 one and for an FP8 one, whose activations are
// bf16), and the engines generate, serve and bench (planned and not)
// allocate exactly those dtypes.
func TestCacheDtypesFollowTheCheckpoint(t *testing.T) {
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	storage := map[string]kernels.DType{"fp32": kernels.F32, "bf16": kernels.BF16}
	for _, c := range []struct{ checkpoint, want string }{{"f32", "fp32"}, {"bf16", "bf16"}, {"fp8", "bf16"}} {
		t.Run(c.checkpoint, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), c.checkpoint)
			if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 5, DType: c.checkpoint}); err != nil {
				t.Fatal(err)
			}
			flags := []string{"--model", dir, "--spec", "auto", "--gpu-mem", "1GiB", "--max-running-requests", "1", "--context", "128"}
			var planOut bytes.Buffer
			if err := planTo(&planOut, append(flags, "--json")); err != nil {
				t.Fatal(err)
			}
			var plan struct {
				Settings struct {
					KVDtype   string `json:"kv_dtype"`
					ConvDtype string `json:"conv_dtype"`
				} `json:"settings"`
			}
			if err := json.Unmarshal(planOut.Bytes(), &plan); err != nil {
				t.Fatal(err)
			}
			if plan.Settings.KVDtype != c.want || plan.Settings.ConvDtype != c.want {
				t.Fatalf("plan: KV %s, conv %s; want %s for a %s checkpoint", plan.Settings.KVDtype, plan.Settings.ConvDtype, c.want, c.checkpoint)
			}
			want := storage[c.want]
			for name, load := range map[string]func(t *testing.T) *engine.Engine{
				"generate": func(t *testing.T) *engine.Engine {
					mf := cpuModelFlags(dir)
					sizing, err := mf.unplannedSizing(1)
					return loadSized(t, mf, sizing, err)
				},
				"serve": func(t *testing.T) *engine.Engine {
					fs := flag.NewFlagSet("serve", flag.ContinueOnError)
					var sc serveConfig
					sc.register(fs)
					if err := fs.Parse(append(flags, "--threads", "1")); err != nil {
						t.Fatal(err)
					}
					discard := slog.New(slog.NewTextHandler(io.Discard, nil))
					sizing, _, err := sc.plan(fs, discard, io.Discard)
					if err != nil {
						t.Fatal(err)
					}
					model, err := sc.load(sizing, discard)
					if err != nil {
						t.Fatal(err)
					}
					return model.Engine
				},
				"bench with --gpu-mem": func(t *testing.T) *engine.Engine {
					mf := cpuModelFlags(dir)
					sizing, err := benchSizing(mf, flag.NewFlagSet("bench", flag.ContinueOnError), 1, "1GiB", 0)
					return loadSized(t, mf, sizing, err)
				},
				"bench": func(t *testing.T) *engine.Engine {
					mf := cpuModelFlags(dir)
					sizing, err := benchSizing(mf, flag.NewFlagSet("bench", flag.ContinueOnError), 1, "", 0)
					return loadSized(t, mf, sizing, err)
				},
			} {
				e := load(t)
				kv, _ := e.Model.KV.Layer(0, 0)
				conv := e.Model.States.Conv(0, 0, 0)
				if kv.DType() != want || conv.DType() != want {
					t.Errorf("%s allocated a %v KV cache and a %v conv state; plan says %s", name, kv.DType(), conv.DType(), c.want)
				}
				e.Close()
			}
		})
	}
}

// TestCacheDtypeFlags: generate's and bench's --kv-dtype and --conv-dtype
// override the checkpoint's dtype, each on its own, and the dtypes the
// engine cannot store are refused by name.
func TestCacheDtypeFlags(t *testing.T) {
	target, _ := tinyModelDirs(t) // an f32 checkpoint
	for _, c := range []struct {
		kv, conv     string
		wantKV, want kernels.DType
		err          string
	}{
		{"", "", kernels.F32, kernels.F32, ""},
		{"bf16", "", kernels.BF16, kernels.F32, ""},
		{"", "bf16", kernels.F32, kernels.BF16, ""},
		{"fp32", "bf16", kernels.F32, kernels.BF16, ""},
		{"fp8", "", 0, 0, "--kv-dtype fp8"},
		{"", "fp16", 0, 0, "--conv-dtype fp16"},
		{"", "fp8", 0, 0, `dtype "fp8"`},
	} {
		fs := flag.NewFlagSet("generate", flag.ContinueOnError)
		var mf modelFlags
		mf.register(fs)
		mf.registerCacheDtypes(fs)
		args := []string{"--model", target}
		if c.kv != "" {
			args = append(args, "--kv-dtype", c.kv)
		}
		if c.conv != "" {
			args = append(args, "--conv-dtype", c.conv)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		sizing, err := mf.unplannedSizing(2)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("--kv-dtype %q --conv-dtype %q: error %v, want one naming %s", c.kv, c.conv, err, c.err)
			}
			continue
		}
		if err != nil || sizing.KVDType != c.wantKV || sizing.ConvDType != c.want || sizing.MaxSeqs != 2 {
			t.Errorf("--kv-dtype %q --conv-dtype %q: %+v, %v; want KV %v, conv %v", c.kv, c.conv, sizing, err, c.wantKV, c.want)
		}
	}
}

// cpuModelFlags are the model flags of an autoregressive one-thread CPU
// engine on dir, as the commands' defaults set them.
func cpuModelFlags(dir string) *modelFlags {
	return &modelFlags{model: dir, spec: "auto", rollback: "replay", context: 128, device: "cpu", tp: 1, threads: 1}
}

// loadSized loads mf's engine with sizing (err from computing it).
func loadSized(t *testing.T, mf *modelFlags, sizing engine.Options, err error) *engine.Engine {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	e, err := mf.load(sizing)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
