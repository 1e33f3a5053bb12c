package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"ddflash/engine/planner"
)

// The reported deployment (docs/cache-sizing.md §6), as the issue writes it.
const reportedArgs = "--model qwen3.6-27b --gpu rtx-pro-6000 --spec ddtree --budget 15 --compat sglang"

func runPlanArgs(t *testing.T, args string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := planTo(&out, strings.Fields(args))
	return out.String(), err
}

func TestPlanReproducesTheReportedDeployment(t *testing.T) {
	cases := []struct {
		mrr  string
		want []string
	}{
		{"4", []string{"KV tokens             87,061", "state slots           24 (4 per request", "max running requests  4 (requested 4"}},
		{"8", []string{"KV tokens             11,893", "state slots           24 (4 per request",
			"warning: KV cache holds 11,893 tokens: only 2 requests of 4,096 tokens fit, fewer than the 8 requested"}},
	}
	for _, c := range cases {
		out, err := runPlanArgs(t, reportedArgs+" --max-running-requests "+c.mrr)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range c.want {
			if !strings.Contains(out, want) {
				t.Errorf("mrr %s: output lacks %q:\n%s", c.mrr, want, out)
			}
		}
		if !strings.Contains(out, "ddflash with replay rollback on the same GPU: ") {
			t.Errorf("mrr %s: no replay comparison:\n%s", c.mrr, out)
		}
	}
}

func TestPlanJSONMatchesThePlanner(t *testing.T) {
	out, err := runPlanArgs(t, "--gpu h200 --max-running-requests 8 --spec ddtree --json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Model      string `json:"model"`
		GPU        string `json:"gpu"`
		ServeFlags string `json:"flags"`
		KVTokens   int64  `json:"kv_tokens"`
		StateSlots int    `json:"state_slots"`
		MaxRunning struct {
			Effective int `json:"effective"`
		} `json:"max_running_requests"`
		Bytes struct {
			PerKVToken int64 `json:"per_kv_token"`
		} `json:"bytes"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	target, _ := planner.LoadTarget("qwen3.6-27b")
	drafter, _ := planner.LoadDrafter("qwen3.6-27b-dflash")
	want, err := planner.Compute(planner.Models{Target: target, Drafter: drafter},
		planner.Knobs{GPUTotal: 143771 << 20, MaxRunningRequests: 8, Spec: planner.SpecDDTree})
	if err != nil {
		t.Fatal(err)
	}
	if got.KVTokens != want.KVTokens || got.StateSlots != 8 || got.MaxRunning.Effective != 8 ||
		got.Bytes.PerKVToken != 65536 || got.Model != "qwen3.6-27b" || got.GPU != "NVIDIA H200" {
		t.Errorf("JSON %+v, planner says %d KV tokens", got, want.KVTokens)
	}
	if !strings.HasPrefix(got.ServeFlags, "ddflash serve --model qwen3.6-27b --draft qwen3.6-27b-dflash --spec ddtree --budget 15 --tp 1 --max-running-requests 8") {
		t.Errorf("serve flags %q", got.ServeFlags)
	}
}

func TestPlanFlagErrors(t *testing.T) {
	cases := []struct {
		args, want string
	}{
		{"--gpu rtx-pro-6000", "--max-running-requests is required"},
		{"--gpu rtx-pro-6000 --max-running-requests 4 --max-mamba-cache-size 10", "--max-mamba-cache-size is an SGLang knob: add --compat sglang"},
		{"--gpu rtx-pro-6000 --max-running-requests 4 --compat sglang --rollback replay", "drop --compat"},
		{"--gpu rtx-pro-6000 --max-running-requests 4 --compat sglang --reserve 8GiB", "--mem-fraction-static"},
		{"--gpu rtx-pro-6000 --max-running-requests 4 --spec linear --budget 7", "--budget applies to --spec ddtree"},
		{"--gpu rtx-pro-6000 --gpu-mem 80GB --max-running-requests 4", "either --gpu or --gpu-mem"},
		{"--gpu v100 --max-running-requests 4", `unknown GPU "v100"`},
		{"--gpu-mem 80 --max-running-requests 4", "want a number and a unit"},
		{"--gpu rtx-pro-6000 --max-running-requests 4 --ssm-dtype fp8", `dtype "fp8": want fp32, bf16 or fp16`},
		{"--gpu rtx-pro-6000 --max-running-requests 4 --spec tree", `spec mode "tree"`},
		{"--gpu rtx-pro-6000 --max-running-requests 4 --model /nonexistent", "neither a built-in model"},
		{"--gpu rtx-pro-6000 --max-running-requests 4 --tp 3", "--tp 3 does not divide"},
	}
	for _, c := range cases {
		_, err := runPlanArgs(t, c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.args, err, c.want)
		}
	}
}

func TestPlanTextShowsEveryUse(t *testing.T) {
	out, err := runPlanArgs(t, "--gpu-mem 97887MiB --gpu-free 90GiB --max-running-requests 8 --rollback snapshot --prefix-cache-slots 2")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"KV cache per token                              64.00 KiB",
		"GDN state per slot                             146.81 MiB",
		"rollback per request (snapshot, 16 tokens)       2.29 GiB",
		"other processes", "runtime reserve", "target weights", "GDN state slots", "prefix-cache checkpoints", "rollback: per-token state snapshots",
		"state slots           10 (1 per request; rollback reserved for 8)",
		"warning: per-token state snapshots take 18.35 GiB",
		"--rollback snapshot", "--prefix-cache-slots 2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestMemoryBar(t *testing.T) {
	segs := []planner.Segment{{Use: "target weights", Bytes: 50}, {Use: "KV cache", Bytes: 33}, {Use: "GDN state slots", Bytes: 17}, {Use: "unassigned", Bytes: 0}}
	if got := memoryBar(segs, 100, 10); got != "WWWWWKKKSS" {
		t.Errorf("bar %q", got)
	}
	// Largest remainders get the spare cells, and the bar keeps its width.
	segs = []planner.Segment{{Use: "target weights", Bytes: 1}, {Use: "KV cache", Bytes: 1}, {Use: "GDN state slots", Bytes: 1}}
	if got := memoryBar(segs, 3, 10); len(got) != 10 || strings.Count(got, "W") != 4 {
		t.Errorf("bar %q", got)
	}
}

func TestWrapLines(t *testing.T) {
	got := wrapLines("short\nsglang flags: --tp-size 1 --max-running-requests 5", 24)
	want := "short\nsglang flags: --tp-size\n    1\n    --max-running-requests 5" // no space to break at
	if got != want {
		t.Errorf("wrapLines = %q, want %q", got, want)
	}
}

func TestPlanThatDoesNotFitExitsNonZero(t *testing.T) {
	out, err := runPlanArgs(t, "--gpu rtx-4090 --max-running-requests 1")
	if err == nil || !strings.Contains(err.Error(), "need 32.59 GiB more than this GPU has") || !strings.Contains(out, "over budget") {
		t.Errorf("error %v, output:\n%s", err, out)
	}
	out, err = runPlanArgs(t, "--gpu rtx-4090 --max-running-requests 1 --json")
	var got struct {
		Fits     bool     `json:"fits"`
		Warnings []string `json:"warnings"`
	}
	if jerr := json.Unmarshal([]byte(out), &got); err == nil || jerr != nil || got.Fits || len(got.Warnings) == 0 {
		t.Errorf("JSON for a plan that does not fit: error %v, %s", err, out)
	}
}

// TestPlanComparesModels: several --model values are planned with the same
// flags and shown side by side; Qwen3.8-27B's figures (the same qwen3_5
// architecture) equal Qwen3.6-27B's, each column the single model's plan.
func TestPlanComparesModels(t *testing.T) {
	out, err := runPlanArgs(t, "--gpu h200 --max-running-requests 8 --spec mtp --model qwen3.6-27b,qwen3.8-27b")
	if err != nil {
		t.Fatal(err)
	}
	single, err := runPlanArgs(t, "--gpu h200 --max-running-requests 8 --spec mtp --model qwen3.8-27b --json")
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		KVTokens int64 `json:"kv_tokens"`
	}
	if err := json.Unmarshal([]byte(single), &p); err != nil {
		t.Fatal(err)
	}
	kv := planner.FormatCount(p.KVTokens)
	var row []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "KV tokens") {
			row = strings.Fields(strings.TrimPrefix(line, "KV tokens"))
		}
	}
	if !strings.Contains(out, "qwen3.8-27b") || len(row) != 2 || row[0] != kv || row[1] != kv {
		t.Errorf("comparison's KV tokens %v, want %s for both (qwen3.8-27b planned alone):\n%s", row, kv, out)
	}
	if _, err := runPlanArgs(t, "--gpu h200 --max-running-requests 8 --model qwen3.6-27b,qwen3.8-27b --json"); err == nil {
		t.Error("--json with two models: no error")
	}
}

// TestPlanMTP: --spec mtp plans the target's own head (no --draft), and its
// serve line asks for it.
func TestPlanMTP(t *testing.T) {
	out, err := runPlanArgs(t, "--gpu h200 --max-running-requests 8 --spec mtp --mtp-steps 4")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"qwen3.6-27b + its MTP head", "linear (MTP, 4 steps)", "draft KV per token                               4.00 KiB", "--spec mtp --mtp-steps 4"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "--draft") {
		t.Errorf("an MTP plan names a DFlash drafter:\n%s", out)
	}
}
