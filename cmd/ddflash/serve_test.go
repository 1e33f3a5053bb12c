package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ddflash/engine/testmodel"
)

func tinyModelDirs(t *testing.T) (target, draft string) {
	t.Helper()
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	target, draft = filepath.Join(dir, "tiny"), filepath.Join(dir, "draft")
	if err := testmodel.Write(target, testmodel.Options{Preset: p, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteDrafter(draft, testmodel.DraftOptions{Target: p, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	return target, draft
}

// TestServeLifecycle starts `ddflash serve` on a free loopback port with
// a memory plan for 1 GiB, waits for /health, completes a request with an
// API key, and shuts down when its context ends; with --tp 2 the greedy
// completion is the same.
func TestServeLifecycle(t *testing.T) {
	target, draft := tinyModelDirs(t)
	one := serveOnce(t, target, draft, "1")
	if two := serveOnce(t, target, draft, "2"); two != one {
		t.Fatalf("--tp 2 completed %q, --tp 1 %q", two, one)
	}
}

// serveOnce runs the server at a tensor-parallel degree through one
// completion and returns its text.
func serveOnce(t *testing.T, target, draft, tp string) string {
	ctx, cancel := context.WithCancel(context.Background())
	base, done := startServe(ctx, t, []string{"--model", target, "--draft", draft, "--spec", "ddtree", "--budget", "4", "--tp", tp, "--gpu-mem", "1GiB",
		"--addr", "127.0.0.1:0", "--max-running-requests", "2", "--threads", "1", "--api-key", "k",
		"--write-timeout", "1m", "--allowed-origins", "https://ui.example, https://two.example"}, nil)
	req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(`{"model": "tiny", "prompt": "the fox", "max_tokens": 5, "temperature": 0, "ignore_eos": true}`))
	req.Header.Set("Authorization", "Bearer k")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", "https://two.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Model   string
		Choices []struct{ Text string }
		Usage   struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	err = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || got.Model != "tiny" || got.Usage.CompletionTokens != 5 || len(got.Choices) != 1 ||
		resp.Header.Get("Access-Control-Allow-Origin") != "https://two.example" {
		t.Fatalf("completion at --tp %s: status %d, %+v, %v", tp, resp.StatusCode, got, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve after shutdown: %v", err)
	}
	return got.Choices[0].Text
}

// TestServeRefusesWhatCannotFit checks that serve stops at the memory plan,
// before listening, with the planner's explanation.
func TestServeRefusesWhatCannotFit(t *testing.T) {
	target, _ := tinyModelDirs(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // were the plan to pass, serve would stop at once rather than hang
	err := serve(ctx, []string{"--model", target, "--gpu-mem", "600MiB", "--addr", "127.0.0.1:0"}, func(string) {
		t.Error("serve listened although the plan does not fit")
	})
	if err == nil || !strings.Contains(err.Error(), "--max-running-requests") {
		t.Fatalf("err = %v, want the planner's shortfall with its remedies", err)
	}
	t.Log(err)
}

// TestServeRunsThePrintedPlan runs the serve line `ddflash plan --json`
// prints for a small model and a memory budget, as printed, and checks
// that serve's start-up log states the same plan: KV tokens, state slots,
// running requests, cache dtypes (a bf16 recurrent state asked of plan) and
// the same serve line.
func TestServeRunsThePrintedPlan(t *testing.T) {
	target, draft := tinyModelDirs(t)
	var planOut bytes.Buffer
	if err := planTo(&planOut, []string{"--model", target, "--draft", draft, "--gpu-mem", "1GiB", "--max-running-requests", "2",
		"--spec", "ddtree", "--budget", "4", "--context", "256", "--ssm-dtype", "bf16", "--json"}); err != nil {
		t.Fatal(err)
	}
	var plan struct {
		Flags      string `json:"flags"`
		KVTokens   int64  `json:"kv_tokens"`
		StateSlots int    `json:"state_slots"`
		MaxRunning struct {
			Effective int `json:"effective"`
		} `json:"max_running_requests"`
		Settings struct {
			KVDtype   string `json:"kv_dtype"`
			ConvDtype string `json:"conv_dtype"`
			SSMDtype  string `json:"ssm_dtype"`
		} `json:"settings"`
	}
	if err := json.Unmarshal(planOut.Bytes(), &plan); err != nil {
		t.Fatal(err)
	}
	args, ok := strings.CutPrefix(plan.Flags, "ddflash serve ")
	if !ok {
		t.Fatalf("plan printed %q, want a ddflash serve line", plan.Flags)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var log bytes.Buffer
	_, done := startServe(ctx, t, append(strings.Fields(args), "--addr", "127.0.0.1:0", "--threads", "1"), &log)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var logged string
	for line := range strings.Lines(log.String()) {
		if strings.Contains(line, `msg="memory plan"`) {
			logged = line
		}
	}
	for _, want := range []string{
		fmt.Sprintf("kv_tokens=%d ", plan.KVTokens),
		fmt.Sprintf("state_slots=%d ", plan.StateSlots),
		fmt.Sprintf("max_running_requests=%d ", plan.MaxRunning.Effective),
		fmt.Sprintf("kv_dtype=%s ", plan.Settings.KVDtype),
		fmt.Sprintf("conv_dtype=%s ", plan.Settings.ConvDtype),
		fmt.Sprintf("ssm_dtype=%s ", plan.Settings.SSMDtype),
		"ssm_dtype=bf16 ",
		fmt.Sprintf("flags=%q", plan.Flags),
	} {
		if !strings.Contains(logged, want) {
			t.Errorf("serve's start-up plan lacks %s\n got: %s", want, logged)
		}
	}
}

// startServe runs serve with args in the background, its log going to
// stderr when given (else to the test's stderr), and returns the server's
// base URL once /health answers, and the channel serve's result comes on
// after ctx is cancelled.
func startServe(ctx context.Context, t *testing.T, args []string, stderr *bytes.Buffer) (base string, done <-chan error) {
	t.Helper()
	var out io.Writer = os.Stderr
	if stderr != nil {
		out = stderr
	}
	addrs := make(chan string, 1)
	result := make(chan error, 1)
	go func() {
		result <- serveTo(ctx, args, func(a string) { addrs <- a }, out)
	}()
	select {
	case a := <-addrs:
		base = "http://" + a
	case err := <-result:
		if stderr != nil {
			t.Fatalf("serve ended before listening: %v\n%s", err, stderr.String())
		}
		t.Fatalf("serve ended before listening: %v", err)
	}
	waitHealthy(t, base)
	return base, result
}

// waitHealthy polls /health until it answers 200.
func waitHealthy(t *testing.T, base string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never healthy: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestServeMTP serves a target with its MTP head (--spec mtp, planned with
// the head's weights and KV, and logged as spec=mtp), and with the head
// beside a DFlash drafter under --spec adaptive --with-mtp (planned as its
// largest tree): a greedy completion equals the one served without
// speculation.
func TestServeMTP(t *testing.T) {
	p, err := testmodel.PresetByName("tiny")
	if err != nil {
		t.Fatal(err)
	}
	target, draft := t.TempDir(), t.TempDir()
	if err := testmodel.Write(target, testmodel.Options{Preset: p, Seed: 4, MTP: true}); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteDrafter(draft, testmodel.DraftOptions{Target: p, Seed: 4}); err != nil {
		t.Fatal(err)
	}
	complete := func(spec ...string) string {
		ctx, cancel := context.WithCancel(context.Background())
		var log bytes.Buffer
		base, done := startServe(ctx, t, append([]string{"--model", target, "--gpu-mem", "1GiB", "--addr", "127.0.0.1:0",
			"--max-running-requests", "2", "--threads", "1"}, spec...), &log)
		resp, err := http.Post(base+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt": "the fox", "max_tokens": 12, "temperature": 0, "ignore_eos": true}`))
		if err != nil {
			t.Fatal(err)
		}
		var got struct{ Choices []struct{ Text string } }
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		cancel()
		if doneErr := <-done; err != nil || doneErr != nil || resp.StatusCode != http.StatusOK || len(got.Choices) != 1 {
			t.Fatalf("serve %v: status %d, %+v, %v, %v\n%s", spec, resp.StatusCode, got, err, doneErr, log.String())
		}
		if spec[1] == "mtp" && !strings.Contains(log.String(), "--spec mtp --mtp-steps 3") {
			t.Errorf("serve %v planned without the MTP head:\n%s", spec, log.String())
		}
		if !strings.Contains(log.String(), "msg=serving model=") || !strings.Contains(log.String(), " spec="+spec[1]+" ") {
			t.Errorf("serve %v: the serving line does not name spec=%s:\n%s", spec, spec[1], log.String())
		}
		return got.Choices[0].Text
	}
	auto := complete("--spec", "auto")
	if mtp := complete("--spec", "mtp", "--mtp-steps", "3"); mtp != auto {
		t.Fatalf("--spec mtp completed %q, --spec auto %q", mtp, auto)
	}
	if adaptive := complete("--spec", "adaptive", "--with-mtp", "--draft", draft); adaptive != auto {
		t.Fatalf("--spec adaptive --with-mtp completed %q, --spec auto %q", adaptive, auto)
	}
}
