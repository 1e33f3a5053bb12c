package planner

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"ddflash/dflash"
	"ddflash/engine"
	"ddflash/engine/config"
	"ddflash/kernels"
	"ddflash/mamba"
)

const (
	mib          = 1 << 20
	gib          = 1 << 30
	rtxPro6000   = 97887 * mib // as the card reports itself (docs/cache-sizing.md §2)
	qwenSlot     = 153_944_064 // P, fp32 ssm + bf16 conv (docs/qwen36-model.md §9)
	qwenKVToken  = 65_536      // C, bf16 (docs/qwen36-model.md §9)
	qwenTextPar  = 26_895_998_464
	qwenVisionPa = 460_730_096
)

func qwen(t *testing.T) Models {
	t.Helper()
	target, err := LoadTarget("qwen3.6-27b")
	if err != nil {
		t.Fatal(err)
	}
	drafter, err := LoadDrafter("qwen3.6-27b-dflash")
	if err != nil {
		t.Fatal(err)
	}
	return Models{Target: target, Drafter: drafter}
}

// reported is the deployment of docs/cache-sizing.md §6 in SGLang mode.
func reported(mrr int) Knobs {
	return Knobs{Mode: ModeSGLang, GPUTotal: rtxPro6000, MaxRunningRequests: mrr,
		Spec: SpecDDTree, Budget: 15, MaxMambaCacheSize: ReportedMambaCacheSize}
}

func mustPlan(t *testing.T, m Models, k Knobs) *Plan {
	t.Helper()
	p, err := Compute(m, k)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReproducesReportedDeployment(t *testing.T) {
	m := qwen(t)
	cases := []struct {
		mrr                     int
		kvTokens                int64
		snapshotReqs, effective int
	}{
		// Reported: mrr=4 gave 24 Mamba slots and 87,061 KV tokens, mrr=8
		// 11,893; the V2 cap min(mrr, 24//4) reserves snapshots for 4, then 6.
		{4, 87_061, 4, 4},
		{8, 11_893, 6, 2},
	}
	for _, c := range cases {
		p := mustPlan(t, m, reported(c.mrr))
		if p.StateSlots != 24 || p.KVTokens != c.kvTokens {
			t.Errorf("mrr=%d: %d slots, %d KV tokens; reported 24 and %d", c.mrr, p.StateSlots, p.KVTokens, c.kvTokens)
		}
		if p.RollbackRequests != c.snapshotReqs || p.MaxRunning.Effective != c.effective || p.MaxRunning.SlotCap != 6 {
			t.Errorf("mrr=%d: snapshots for %d, slot cap %d, effective %d; want %d, 6, %d",
				c.mrr, p.RollbackRequests, p.MaxRunning.SlotCap, p.MaxRunning.Effective, c.snapshotReqs, c.effective)
		}
		if p.DraftTokens != 16 || p.SlotsPerRequest != 4 {
			t.Errorf("mrr=%d: D=%d r=%d, the fitting variant has D=16 r=4", c.mrr, p.DraftTokens, p.SlotsPerRequest)
		}
		// §6.2: the V2/D=16/r=4 row needs R = 17.93 GiB and mfs ≈ 0.762, in
		// the 0.761–0.783 range of SGLang's automatic rule.
		if r := float64(p.CacheBudget) / gib; math.Round(r*100)/100 != 17.93 {
			t.Errorf("mrr=%d: %.4f GiB for KV and Mamba, the doc's fit needs 17.93", c.mrr, r)
		}
		if p.MemFraction < 0.761 || p.MemFraction > 0.763 {
			t.Errorf("mrr=%d: automatic mem_fraction_static %.4f, want ≈0.762", c.mrr, p.MemFraction)
		}
		if err := p.Fits(); err != nil {
			t.Errorf("mrr=%d: %v", c.mrr, err)
		}
	}
	// §6.1: the drop is exactly 32 more snapshot states of 2,349 tokens each.
	if d := int64(87_061 - 11_893); d != 32*qwenSlot/qwenKVToken {
		t.Errorf("ΔKV %d is not 32 states", d)
	}
	p := mustPlan(t, m, reported(8))
	want := "KV cache holds 11,893 tokens: only 2 requests of 4,096 tokens fit, fewer than the 8 requested"
	if !contains(p.Warnings, want) || !contains(p.Warnings, "cap running requests at 6, below the 8 requested") {
		t.Errorf("warnings %q lack the KV and slot caps", p.Warnings)
	}
}

func TestSGLangRules(t *testing.T) {
	m := qwen(t)
	// §6.3: the default ratio rule (m = 0.9, V2) gives 11 slots from the same
	// rest memory, which would cap the server at 2 running requests.
	k := reported(4)
	k.MaxMambaCacheSize = 0
	if p := mustPlan(t, m, k); p.StateSlots != 11 || p.MaxRunning.SlotCap != 2 {
		t.Errorf("ratio rule: %d slots, cap %d; doc says 11 and 2", p.StateSlots, p.MaxRunning.SlotCap)
	}
	// --disable-radix-cache: one slot per request, S = mrr.
	k.DisableRadixCache = true
	if p := mustPlan(t, m, k); p.StateSlots != 4 || p.SlotsPerRequest != 1 {
		t.Errorf("no radix cache: %d slots, r=%d; want 4 and 1", p.StateSlots, p.SlotsPerRequest)
	}
	// Linear DFLASH inflates the KV cell by the draft layers: 65,536·21/16.
	k = reported(4)
	k.Spec = SpecLinear
	p := mustPlan(t, m, k)
	kvAndDraft := p.segment("KV cache") + p.segment("draft KV cache")
	if p.KVTokens == 0 || kvAndDraft != p.KVTokens*86_016 {
		t.Errorf("linear: %d tokens take %d B, want 86,016 B each", p.KVTokens, kvAndDraft)
	}
	// An explicit --mem-fraction-static replaces the automatic one.
	k = reported(4)
	k.MemFraction = 0.85
	if p := mustPlan(t, m, k); p.MemFraction != 0.85 || p.KVTokens <= 87_061 {
		t.Errorf("mfs 0.85: %g, %d tokens", p.MemFraction, p.KVTokens)
	}
}

func TestSGLangAutoMemFraction(t *testing.T) {
	v := qwen(t).Target.Vision
	// docs/cache-sizing.md §2: 0.837–0.847 before the VLM factor, 0.761–0.783 after.
	base := sglangAutoMemFraction(rtxPro6000, 1, true, Vision{})
	withVLM := sglangAutoMemFraction(rtxPro6000, 1, true, v)
	if base < 0.837 || base > 0.847 || withVLM < 0.761 || withVLM > 0.783 {
		t.Errorf("auto mfs %.4f, with the vision tower %.4f", base, withVLM)
	}
	// Speculation and more ranks reserve more.
	if sglangAutoMemFraction(rtxPro6000, 1, false, v) <= withVLM || sglangAutoMemFraction(rtxPro6000, 8, true, v) >= withVLM {
		t.Error("auto mfs does not shrink with speculation and TP")
	}
}

func TestUnitCostsMatchTheDocs(t *testing.T) {
	m := qwen(t)
	for _, mode := range []Mode{ModeDDFlash, ModeSGLang} {
		k := reported(4)
		k.Mode = mode
		p := mustPlan(t, m, k)
		b := p.Bytes
		if b.PerKVToken != qwenKVToken || b.PerStateSlot != qwenSlot {
			t.Errorf("%s: %d B per KV token, %d B per slot; docs: 65,536 and 153,944,064", mode, b.PerKVToken, b.PerStateSlot)
		}
		wantWeights := int64(2 * qwenTextPar) // ddflash is text-only
		if mode == ModeSGLang {
			wantWeights += 2 * qwenVisionPa
		}
		if b.TargetWeights != wantWeights {
			t.Errorf("%s: target weights %d, want %d", mode, b.TargetWeights, wantWeights)
		}
		if gb := float64(b.DraftWeights) / 1e9; math.Round(gb*100)/100 != 3.46 {
			t.Errorf("%s: draft weights %.3f GB, docs say 3.46", mode, gb)
		}
	}
	// §9: 50.10 GiB of text weights, 0.86 GiB of vision.
	if g := 2 * float64(qwenTextPar) / gib; math.Round(g*100)/100 != 50.10 {
		t.Errorf("text weights %.3f GiB", g)
	}
	// Draft KV: 20 KiB per token for five layers in SGLang's pool; ddflash pages
	// only the full layer and keeps a ring per request for each of the four
	// sliding ones: the 2,048-token window and a 16-token block in 16-token
	// pages, plus the page the window starts in: 2,080 tokens.
	s := mustPlan(t, m, reported(4))
	d := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree})
	if s.Bytes.DraftKVPerToken != 20*1024 || d.Bytes.DraftKVPerToken != 4096 || d.Bytes.DraftKVPerRequest != 4*2080*4096 {
		t.Errorf("draft KV: sglang %d/token, ddflash %d/token + %d/request", s.Bytes.DraftKVPerToken, d.Bytes.DraftKVPerToken, d.Bytes.DraftKVPerRequest)
	}
}

func TestReplayRollbackKeepsTheKVCache(t *testing.T) {
	m := qwen(t)
	// Same GPU, mrr 8, budget 15: replay keeps at least 80,000 KV tokens and
	// all 8 requests, where SGLang's snapshots left 11,893.
	p := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 8, Spec: SpecDDTree, Budget: 15})
	if p.KVTokens < 80_000 || p.MaxRunning.Effective != 8 || p.StateSlots != 8 {
		t.Errorf("replay: %d KV tokens, %d slots, effective %d", p.KVTokens, p.StateSlots, p.MaxRunning.Effective)
	}
	if p.Bytes.RollbackPerRequest > 100*mib {
		t.Errorf("replay rollback %s per request", FormatBytes(p.Bytes.RollbackPerRequest))
	}
	// The same engine with snapshots pays D·P per request.
	k := p.Settings
	k.Rollback = mamba.Snapshot
	s := mustPlan(t, m, k)
	if s.Bytes.RollbackPerRequest != 16*qwenSlot {
		t.Errorf("snapshot rollback %d per request, want 16·P", s.Bytes.RollbackPerRequest)
	}
	spent := (s.Bytes.RollbackPerRequest - p.Bytes.RollbackPerRequest) * 8
	if lost := p.KVTokens - s.KVTokens; lost != spent/(qwenKVToken+4096) && lost != spent/(qwenKVToken+4096)+1 {
		t.Errorf("snapshots cost %d tokens, want %d", lost, spent/(qwenKVToken+4096))
	}
	if !containsPrefix(s.Warnings, "per-token state snapshots take 18.35 GiB") {
		t.Errorf("warnings %q", s.Warnings)
	}
}

func TestTensorParallel(t *testing.T) {
	m := qwen(t)
	one := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree})
	two := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree, TP: 2})
	if two.Bytes.PerKVToken*2 != one.Bytes.PerKVToken || two.Bytes.PerStateSlot*2 != one.Bytes.PerStateSlot {
		t.Errorf("TP 2 does not halve per-rank caches: %+v vs %+v", two.Bytes, one.Bytes)
	}
	// Rank 0 keeps the whole embedding and the whole drafter; the rest
	// (the untied LM head too) is halved.
	tc := m.Target.Config
	embed := int64(tc.VocabSize*tc.HiddenSize) * 2 // bf16
	if tc.TieWordEmbeddings {
		t.Fatal("the Qwen3.6-27B preset has an untied LM head")
	}
	if want := embed + (one.Bytes.TargetWeights-embed)/2; two.Bytes.TargetWeights != want || two.Bytes.DraftWeights != one.Bytes.DraftWeights {
		t.Errorf("TP 2 rank 0 weights: target %d, drafter %d; want %d and the whole drafter %d",
			two.Bytes.TargetWeights, two.Bytes.DraftWeights, want, one.Bytes.DraftWeights)
	}
	// SGLang shards all of it.
	sgOne := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree, Mode: ModeSGLang})
	sgTwo := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree, Mode: ModeSGLang, TP: 2})
	if sgTwo.Bytes.TargetWeights*2 != sgOne.Bytes.TargetWeights || sgTwo.Bytes.DraftWeights*2 != sgOne.Bytes.DraftWeights {
		t.Errorf("SGLang TP 2 does not halve the weights: %+v vs %+v", sgTwo.Bytes, sgOne.Bytes)
	}
	// 4 KV heads over 8 ranks: each rank keeps one head.
	eight := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree, TP: 8})
	if eight.Bytes.PerKVToken != 16*2*1*256*2 {
		t.Errorf("TP 8: %d B per token, want one replicated head", eight.Bytes.PerKVToken)
	}
	_, err := Compute(m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, TP: 3})
	if err == nil || !strings.Contains(err.Error(), "--tp 3 does not divide the 16 GDN key heads") {
		t.Errorf("TP 3: %v", err)
	}
}

func TestFitsExplainsShortfalls(t *testing.T) {
	m := qwen(t)
	cases := []struct {
		name string
		k    Knobs
		want string
	}{
		{"weights exceed a 24 GiB card", Knobs{GPUTotal: 24564 * mib, MaxRunningRequests: 1, Spec: SpecDDTree}, "more than this GPU has"},
		{"context longer than the cache", Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Context: 2_000_000}, "less than one request of 2,000,000 tokens"},
		{"sglang snapshots exceed the budget", Knobs{Mode: ModeSGLang, GPUTotal: rtxPro6000, MaxRunningRequests: 8, Spec: SpecDDTree, MaxMambaCacheSize: 120}, "exceed the"},
		{"sglang slots fewer than r", Knobs{Mode: ModeSGLang, GPUTotal: rtxPro6000, MaxRunningRequests: 8, Spec: SpecDDTree, MaxMambaCacheSize: 3}, "leave no room for a running request"},
	}
	for _, c := range cases {
		p := mustPlan(t, m, c.k)
		err := p.Fits()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Fits() = %v, want %q", c.name, err, c.want)
		}
		if !containsPrefix(p.Warnings, "does not fit: ") {
			t.Errorf("%s: warnings %q do not say it does not fit", c.name, p.Warnings)
		}
	}
}

func TestMemoryAddsUpAndShrinksMonotonically(t *testing.T) {
	m := qwen(t)
	for _, mode := range []Mode{ModeDDFlash, ModeSGLang} {
		for _, spec := range []Spec{SpecAutoregressive, SpecLinear, SpecDDTree} {
			prev := int64(math.MaxInt64)
			for mrr := 1; mrr <= 6; mrr++ {
				k := Knobs{Mode: mode, GPUTotal: rtxPro6000, GPUFree: rtxPro6000 - gib, MaxRunningRequests: mrr, Spec: spec, Rollback: mamba.Snapshot}
				p := mustPlan(t, m, k)
				if got := sumSegments(p.Memory); got != rtxPro6000 {
					t.Errorf("%s %s mrr=%d: segments sum to %d, not the GPU's %d", mode, spec, mrr, got, int64(rtxPro6000))
				}
				for _, s := range p.Memory {
					if s.Bytes < 0 {
						t.Errorf("%s %s mrr=%d: %s is negative", mode, spec, mrr, s.Use)
					}
				}
				if p.segment("other processes") != gib {
					t.Errorf("%s: memory used elsewhere not shown", mode)
				}
				if p.KVTokens > prev {
					t.Errorf("%s %s: KV tokens grow from %d to %d as mrr rises to %d", mode, spec, prev, p.KVTokens, mrr)
				}
				prev = p.KVTokens
				if spec == SpecAutoregressive && (p.DraftTokens != 0 || p.Bytes.DraftWeights != 0 || p.Bytes.RollbackPerRequest != 0) {
					t.Errorf("%s autoregressive plan carries draft costs: %+v", mode, p.Bytes)
				}
			}
		}
	}
	// A larger DDTree budget never leaves more KV cache.
	prev := int64(math.MaxInt64)
	for _, budget := range []int{7, 15, 31, 63} {
		p := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 8, Spec: SpecDDTree, Budget: budget})
		if p.DraftTokens != budget+1 || p.KVTokens > prev {
			t.Errorf("budget %d: D=%d, %d tokens after %d", budget, p.DraftTokens, p.KVTokens, prev)
		}
		prev = p.KVTokens
	}
}

func TestWarnings(t *testing.T) {
	m := qwen(t)
	base := Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree}
	cases := []struct {
		edit func(*Knobs)
		want string
	}{
		{func(k *Knobs) { k.Context = 300_000; k.MaxRunningRequests = 1 }, "context 300,000 is longer than the model's 262,144 positions"},
		{func(k *Knobs) { k.SSMDtype = BF16 }, "bf16 recurrent state"},
		{func(k *Knobs) { k.Context = 131_072 }, "only 3 requests of 131,072 tokens fit, fewer than the 4 requested"},
	}
	for _, c := range cases {
		k := base
		c.edit(&k)
		if p := mustPlan(t, m, k); !containsPrefix(p.Warnings, c.want) && !contains(p.Warnings, c.want) {
			t.Errorf("warnings %q lack %q", p.Warnings, c.want)
		}
	}
	if p := mustPlan(t, m, base); len(p.Warnings) != 0 {
		t.Errorf("a comfortable plan warns: %q", p.Warnings)
	}
}

func TestComputeRejectsBadInput(t *testing.T) {
	m := qwen(t)
	ok := Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree}
	cases := []struct {
		edit func(*Knobs, *Models)
		want string
	}{
		{func(k *Knobs, _ *Models) { k.GPUTotal = 0 }, "--gpu NAME or --gpu-mem SIZE"},
		{func(k *Knobs, _ *Models) { k.GPUFree = k.GPUTotal + 1 }, "free GPU memory"},
		{func(k *Knobs, _ *Models) { k.MaxRunningRequests = 0 }, "--max-running-requests must be at least 1"},
		{func(k *Knobs, _ *Models) { k.MemFraction = 1.5 }, "outside (0, 1]"},
		{func(k *Knobs, _ *Models) { k.Budget = -1 }, "--budget must not be negative"},
		{func(_ *Knobs, m *Models) { m.Drafter = nil }, "needs a DFlash drafter"},
		{func(_ *Knobs, m *Models) { d := *m.Drafter; d.HiddenSize = 4096; m.Drafter = &d }, "hidden_size 4096 differs"},
		{func(_ *Knobs, m *Models) { m.Target = nil }, "no target model"},
	}
	for _, c := range cases {
		k, mm := ok, m
		c.edit(&k, &mm)
		if _, err := Compute(mm, k); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}

func TestLoadModels(t *testing.T) {
	m := qwen(t)
	if m.Target.Vision.Params != qwenVisionPa || textParams(m.Target.Config) != qwenTextPar {
		t.Errorf("params: text %d vision %d; docs/qwen36-model.md §7: %d and %d",
			textParams(m.Target.Config), m.Target.Vision.Params, int64(qwenTextPar), int64(qwenVisionPa))
	}
	// A directory works like the preset.
	dir := t.TempDir()
	data, err := presets.ReadFile("presets/qwen3.6-27b.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	fromDir, err := LoadTarget(dir)
	if err != nil || fromDir.Vision != m.Target.Vision || fromDir.Config.NumLayers != 64 {
		t.Errorf("LoadTarget(dir) = %+v, %v", fromDir, err)
	}
	if _, err := LoadTarget(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "qwen3.6-27b") {
		t.Errorf("missing model: %v (should list the presets)", err)
	}
	if _, err := LoadDrafter(dir); err == nil || !strings.Contains(err.Error(), "field hidden_size: missing") {
		t.Errorf("a target config as drafter: %v", err)
	}
	if got := TargetPresets(); !slices.Equal(got, []string{"qwen3.6-27b", "qwen3.6-27b-fp8", "qwen3.8-27b"}) {
		t.Errorf("target presets %v", got)
	}
	if got := DrafterPresets(); !slices.Equal(got, []string{"qwen3.6-27b-dflash", "qwen3.8-27b-dflash2"}) {
		t.Errorf("drafter presets %v", got)
	}
}

// TestQwen38DFlash2Preset: the Qwen3.8-27B DFlash2 drafter preset is the
// config in dflash/testdata (its source in SOURCES.md there), loads as
// DFlash2, fits the Qwen3.8-27B target and plans an 8-row block.
func TestQwen38DFlash2Preset(t *testing.T) {
	preset, err := presets.ReadFile("presets/qwen3.8-27b-dflash2.json")
	if err != nil {
		t.Fatal(err)
	}
	source, err := os.ReadFile("../../dflash/testdata/qwen3.8-27b-dflash2.config.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(preset, source) {
		t.Error("presets/qwen3.8-27b-dflash2.json differs from dflash/testdata/qwen3.8-27b-dflash2.config.json")
	}
	target, err := LoadTarget("qwen3.8-27b")
	if err != nil {
		t.Fatal(err)
	}
	d, err := LoadDrafter("qwen3.8-27b-dflash2")
	if err != nil {
		t.Fatal(err)
	}
	if d.V2 == nil || d.BlockSize != 8 {
		t.Fatalf("qwen3.8-27b-dflash2: DFlash2 fields %+v, block %d; want DFlash2 with block 8", d.V2, d.BlockSize)
	}
	p := mustPlan(t, Models{Target: target, Drafter: d}, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecLinear})
	if p.DraftTokens != 8 || p.Bytes.DraftWeights != d.WeightParams()*2 {
		t.Errorf("linear plan: %d verify tokens, %d draft weight bytes; want 8 and %d", p.DraftTokens, p.Bytes.DraftWeights, d.WeightParams()*2)
	}
}

// TestQwen38Preset: Qwen3.8-27B is the qwen3_5 architecture of Qwen3.6-27B
// (issue 35): 48 GDN and 16 attention layers, one MTP layer, the same
// parameter counts as docs/qwen36-model.md §7 gives.
func TestQwen38Preset(t *testing.T) {
	m, err := LoadTarget("qwen3.8-27b")
	if err != nil {
		t.Fatal(err)
	}
	c := m.Config
	if c.NumLinear() != 48 || c.NumFull() != 16 || c.MTPLayers != 1 || c.HiddenSize != 5120 {
		t.Errorf("qwen3.8-27b: %d GDN + %d attention layers, %d MTP, hidden %d; want 48 + 16, 1, 5120", c.NumLinear(), c.NumFull(), c.MTPLayers, c.HiddenSize)
	}
	if textParams(c) != qwenTextPar || m.Vision.Params != qwenVisionPa {
		t.Errorf("params: text %d vision %d; want %d and %d", textParams(c), m.Vision.Params, int64(qwenTextPar), int64(qwenVisionPa))
	}
}

// TestMTPPlan: with the target's MTP head as the drafter, the plan counts
// the head's weights and its one attention layer's KV per token, verifies
// steps+1 tokens, and loads no DFlash drafter; without speculation it
// counts none of it.
func TestMTPPlan(t *testing.T) {
	m := Models{Target: qwen(t).Target}
	p := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecLinear, MTPSteps: 3})
	// Qwen3.6-27B's head, bf16, from the shapes of its config: fc 5120×10240;
	// q_proj 12288×5120 (query and gate), k/v 1024×5120, o 5120×6144; MLP
	// 3 × 17408×5120; five 5120-wide norms and q/k norms of 256.
	const params = 5120*10240 + 12288*5120 + 2*1024*5120 + 5120*6144 + 3*17408*5120 + 5*5120 + 2*256
	if p.Bytes.DraftWeights != 2*params || p.Bytes.DraftKVPerToken != 2*4*256*2 || p.DraftTokens != 4 {
		t.Errorf("MTP plan: draft weights %d, draft KV per token %d, verify tokens %d; want %d, %d, 4",
			p.Bytes.DraftWeights, p.Bytes.DraftKVPerToken, p.DraftTokens, 2*params, 2*4*256*2)
	}
	tree := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree, MTPSteps: 3})
	if tree.Settings.Budget != 3 || tree.Bytes.DraftWeights != p.Bytes.DraftWeights {
		t.Errorf("MTP tree plan: budget %d (want the steps, 3), draft weights %d", tree.Settings.Budget, tree.Bytes.DraftWeights)
	}
	auto := mustPlan(t, m, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, MTPSteps: 3})
	if auto.Bytes.DraftWeights != 0 || auto.Bytes.DraftKVPerToken != 0 || auto.Settings.MTPSteps != 0 {
		t.Errorf("autoregressive plan counts the MTP head: %+v", auto.Bytes)
	}
	if auto.KVTokens <= p.KVTokens {
		t.Errorf("the MTP head's weights and KV leave %d KV tokens, as many as without it (%d)", p.KVTokens, auto.KVTokens)
	}
	// Beside a DFlash drafter (--with-mtp, bench's mtpN and DFlash modes)
	// both are counted.
	both := qwen(t)
	dflashOnly := mustPlan(t, both, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree, Budget: 15})
	withHead := mustPlan(t, both, Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree, Budget: 15, MTPSteps: 3})
	if withHead.Bytes.DraftWeights != dflashOnly.Bytes.DraftWeights+p.Bytes.DraftWeights ||
		withHead.Bytes.DraftKVPerToken != dflashOnly.Bytes.DraftKVPerToken+p.Bytes.DraftKVPerToken ||
		withHead.Bytes.DraftKVPerRequest != dflashOnly.Bytes.DraftKVPerRequest || withHead.DraftTokens != 16 {
		t.Errorf("the head beside the DFlash drafter: %+v, %d verify tokens; the drafter alone %+v", withHead.Bytes, withHead.DraftTokens, dflashOnly.Bytes)
	}
}

// TestDraftersBeside: a drafter planned beside the first (bench's --draft2
// modes with --draft's) adds its weights and KV, so fewer KV tokens fit;
// SGLang's rules load one drafter and refuse a second.
func TestDraftersBeside(t *testing.T) {
	m := qwen(t)
	k := Knobs{GPUTotal: rtxPro6000, MaxRunningRequests: 4, Spec: SpecDDTree, Budget: 15}
	one := mustPlan(t, m, k)
	m.Beside = []*dflash.Config{m.Drafter}
	two := mustPlan(t, m, k)
	if two.Bytes.DraftWeights != 2*one.Bytes.DraftWeights || two.Bytes.DraftKVPerToken != 2*one.Bytes.DraftKVPerToken ||
		two.Bytes.DraftKVPerRequest != 2*one.Bytes.DraftKVPerRequest || two.DraftTokens != one.DraftTokens {
		t.Errorf("two drafters: %+v; one: %+v", two.Bytes, one.Bytes)
	}
	if two.KVTokens >= one.KVTokens {
		t.Errorf("a second drafter leaves %d KV tokens, not fewer than one drafter's %d", two.KVTokens, one.KVTokens)
	}
	k.Mode = ModeSGLang
	if _, err := Compute(m, k); err == nil {
		t.Error("SGLang's rules planned two drafters")
	}
	k.Mode, k.Spec = ModeDDFlash, SpecAutoregressive
	if auto := mustPlan(t, m, k); auto.Bytes.DraftWeights != 0 {
		t.Errorf("autoregressive decoding counts the drafters: %+v", auto.Bytes)
	}
}

func TestPlanJSON(t *testing.T) {
	p := mustPlan(t, qwen(t), reported(4))
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		KVTokens   int64 `json:"kv_tokens"`
		StateSlots int   `json:"state_slots"`
		MaxRunning struct {
			Effective int `json:"effective"`
		} `json:"max_running_requests"`
		Bytes    map[string]int64 `json:"bytes"`
		Settings map[string]any   `json:"settings"`
		Warnings []string         `json:"warnings"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if out.KVTokens != 87_061 || out.StateSlots != 24 || out.MaxRunning.Effective != 4 ||
		out.Bytes["per_kv_token"] != qwenKVToken || out.Bytes["per_state_slot"] != qwenSlot ||
		out.Settings["spec"] != "ddtree" || out.Settings["ssm_dtype"] != "fp32" || out.Settings["mode"] != "sglang" {
		t.Errorf("JSON %s", data)
	}
}

func TestFormat(t *testing.T) {
	cases := map[int64]string{qwenSlot: "146.81 MiB", 65536: "64.00 KiB", 16 * qwenSlot: "2.29 GiB", 12: "12 B", -3 * gib: "-3.00 GiB"}
	for n, want := range cases {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
	counts := map[int64]string{11893: "11,893", 87061: "87,061", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4096: "-4,096"}
	for n, want := range counts {
		if got := FormatCount(n); got != want {
			t.Errorf("FormatCount(%d) = %q, want %q", n, got, want)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}

func containsPrefix(list []string, prefix string) bool {
	for _, x := range list {
		if strings.HasPrefix(x, prefix) {
			return true
		}
	}
	return false
}

// TestEngineOptions maps a plan's cache dtypes and figures to the engine's
// sizing and refuses what the engine cannot store.
func TestEngineOptions(t *testing.T) {
	for _, c := range []struct {
		kv, conv, ssm DType
		prefix        int
		err           string
	}{
		{BF16, BF16, FP32, 0, ""},
		{FP32, FP32, FP32, 0, ""},
		{FP16, BF16, FP32, 0, "--kv-dtype fp16"},
		{FP8, BF16, FP32, 0, "--kv-dtype fp8"},
		{BF16, FP16, FP32, 0, "--conv-dtype fp16"},
		{BF16, BF16, BF16, 0, ""},
		{FP32, FP32, BF16, 0, ""},
		{BF16, BF16, FP16, 0, "--ssm-dtype fp16"},
		{BF16, BF16, FP32, 2, ""},
	} {
		p := &Plan{KVTokens: 1234, Settings: Knobs{KVDtype: c.kv, ConvDtype: c.conv, SSMDtype: c.ssm, PrefixSlots: c.prefix, Context: 99}}
		p.MaxRunning.Effective = 3
		opts, err := p.EngineOptions()
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: error %v, want one naming %s", c, err, c.err)
			}
			continue
		}
		wantKV, wantConv, wantSSM := kernels.BF16, kernels.BF16, engine.SSMF32
		if c.kv == FP32 {
			wantKV, wantConv = kernels.F32, kernels.F32
		}
		if c.ssm == BF16 {
			wantSSM = engine.SSMBF16
		}
		if err != nil || opts.KVTokens != 1234 || opts.MaxSeqs != 3 || opts.Context != 99 || opts.KVDType != wantKV || opts.ConvDType != wantConv || opts.SSMDType != wantSSM || opts.PrefixSlots != c.prefix {
			t.Errorf("%+v: options %+v, %v", c, opts, err)
		}
	}
}

// TestCacheDTypeDefaults: the KV cache and conv state default to the
// checkpoint's activation dtype (fp32 for float32, bf16 for bfloat16 and
// its FP8 form, and for float16, which the engine does not store), except
// SGLang's conv state, bf16 always; an explicit dtype stays.
func TestCacheDTypeDefaults(t *testing.T) {
	for _, c := range []struct {
		dtype    string
		mode     Mode
		kv, conv DType
	}{
		{"float32", ModeDDFlash, FP32, FP32},
		{"bfloat16", ModeDDFlash, BF16, BF16},
		{"float16", ModeDDFlash, BF16, BF16},
		{"", ModeDDFlash, BF16, BF16},
		{"float32", ModeSGLang, FP32, BF16},
		{"bfloat16", ModeSGLang, BF16, BF16},
	} {
		target := &Target{Config: &config.Config{Dtype: c.dtype, SSMDtype: "bfloat16"}}
		k := Knobs{Mode: c.mode}.withCacheDefaults(target)
		if k.KVDtype != c.kv || k.ConvDtype != c.conv || k.SSMDtype != BF16 {
			t.Errorf("%q checkpoint, %s rules: KV %s, conv %s, ssm %s; want %s, %s, bf16", c.dtype, c.mode, k.KVDtype.Name, k.ConvDtype.Name, k.SSMDtype.Name, c.kv.Name, c.conv.Name)
		}
	}
	explicit := Knobs{KVDtype: BF16, ConvDtype: FP32}.withCacheDefaults(&Target{Config: &config.Config{Dtype: "float32", SSMDtype: "float32"}})
	if explicit.KVDtype != BF16 || explicit.ConvDtype != FP32 {
		t.Errorf("explicit bf16 KV and fp32 conv became %s and %s", explicit.KVDtype.Name, explicit.ConvDtype.Name)
	}
}
