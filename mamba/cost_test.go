package mamba

import (
	"fmt"
	"math"
	"testing"

	"ddflash/internal/closeness"
	"ddflash/kernels"
)

// qwen36Shape is Qwen3.6-27B's GDN geometry (docs/qwen36-model.md §1): 48 GDN
// layers, 16 key heads and 48 value heads of 128, conv kernel 4.
func qwen36Shape() Shape {
	return Shape{
		Layers:     48,
		ConvDim:    10240,
		ConvKernel: 4,
		GDN:        kernels.GDNShape{KeyHeads: 16, ValueHeads: 48, KeyDim: 128, ValueDim: 128},
	}
}

const mib = 1 << 20
const gib = 1 << 30

func TestSlotBytesQwen36(t *testing.T) {
	// docs/qwen36-model.md §9 and docs/cache-sizing.md §1.
	cases := []struct {
		ssm, conv int
		want      int64
	}{
		{4, 2, 153_944_064}, // SGLang's default: fp32 ssm, bf16 conv (146.81 MiB)
		{2, 2, 78_446_592},
		{4, 4, 156_893_184},
	}
	for _, c := range cases {
		got := SlotBytes(qwen36Shape(), c.ssm, c.conv)
		if got != c.want {
			t.Errorf("SlotBytes(ssm %d B, conv %d B) = %d, want %d", c.ssm, c.conv, got, c.want)
		}
	}
	if got := float64(SlotBytes(qwen36Shape(), 4, 2)) / mib; !closeness.Near(got, 146.81, 0.005) {
		t.Errorf("slot = %.3f MiB, the docs say 146.81 MiB", got)
	}
	// One slot costs exactly as much as 2,349 bf16 KV tokens (64 KiB each).
	if got := SlotBytes(qwen36Shape(), 4, 2); got != 2349*65536 {
		t.Errorf("slot = %d B, want 2,349 KV tokens = %d B", got, 2349*65536)
	}
}

func TestSnapshotBytesMatchesDocTable(t *testing.T) {
	// docs/dflash-ddtree.md §4.4: GiB per request for D draft tokens, fp32 and bf16 ssm
	// (bf16 conv), rounded to two decimals.
	table := []struct {
		draftTokens int
		fp32, bf16  float64
	}{
		{8, 1.15, 0.58}, {16, 2.29, 1.17}, {17, 2.44, 1.24},
		{23, 3.30, 1.68}, {33, 4.73, 2.41}, {65, 9.32, 4.75},
	}
	for _, row := range table {
		for _, c := range []struct {
			ssm  int
			want float64
		}{{4, row.fp32}, {2, row.bf16}} {
			got := float64(SnapshotBytes(qwen36Shape(), c.ssm, 2, row.draftTokens)) / gib
			if math.Round(got*100)/100 != c.want {
				t.Errorf("D=%d ssm %d B: %.4f GiB, table says %.2f", row.draftTokens, c.ssm, got, c.want)
			}
		}
	}
}

func TestSnapshotBytesSGLangLayerNote(t *testing.T) {
	// cache-sizing cross-check: bf16 ssm, 5 spec slots × 4 draft tokens is
	// exactly 30.00 MiB of intermediate ssm per GDN layer (no conv window).
	layer := qwen36Shape()
	layer.Layers, layer.ConvKernel = 1, 1
	if got := 5 * SnapshotBytes(layer, 2, 2, 4); got != 30*mib {
		t.Errorf("5 slots × 4 tokens = %d B, want 30 MiB", got)
	}
}

// replayReference lists what replay keeps per token and GDN layer, tensor by
// tensor, in float64 bytes.
func replayReference(draftTokens int, ssmBytes, convBytes float64, tree bool) float64 {
	perLayer := []struct {
		name   string
		elems  float64
		nbytes float64
	}{
		{"q", 16 * 128, 4}, {"k", 16 * 128, 4}, {"v", 48 * 128, 4},
		{"g", 48, 4}, {"beta", 48, 4}, {"conv input", 10240, convBytes},
	}
	perToken := 0.0
	for _, t := range perLayer {
		perToken += 48 * t.elems * t.nbytes
	}
	working := 1.0
	if tree {
		working = float64(draftTokens)
	}
	return float64(draftTokens)*perToken + working*48*128*128*ssmBytes
}

func TestReplayBytes(t *testing.T) {
	for _, tree := range []bool{false, true} {
		for _, d := range []int{1, 8, 16, 23, 65} {
			for _, conv := range []int{2, 4} {
				for _, ssm := range []int{2, 4} {
					t.Run(fmt.Sprintf("tree=%v/D=%d/conv=%d/ssm=%d", tree, d, conv, ssm), func(t *testing.T) {
						got := ReplayBytes(qwen36Shape(), ssm, conv, d, tree)
						if want := replayReference(d, float64(ssm), float64(conv), tree); float64(got) != want {
							t.Errorf("got %d B, want %.0f", got, want)
						}
					})
				}
			}
		}
	}
	// The doc's rounded figures: 1.9 MiB per token of fp32 recurrence inputs,
	// 0.94 MiB of bf16 conv inputs, about 65 MiB for 23 tokens.
	perToken := func(conv int) float64 {
		return float64(ReplayBytes(qwen36Shape(), 4, conv, 2, false)-ReplayBytes(qwen36Shape(), 4, conv, 1, false)) / mib
	}
	if got := perToken(0); math.Round(got*10)/10 != 1.9 {
		t.Errorf("recurrence inputs = %.3f MiB per token, doc says ≈1.9", got)
	}
	if got := perToken(2) - perToken(0); math.Round(got*100)/100 != 0.94 {
		t.Errorf("conv inputs = %.3f MiB per token, doc says ≈0.94", got)
	}
	if got := 23 * perToken(2); math.Round(got) != 65 {
		t.Errorf("23 tokens = %.1f MiB, doc says ≈65", got)
	}
}

func TestReplayIsFarCheaperThanSnapshots(t *testing.T) {
	// The reason ddflash replays: at DDTree budget 15 (16 tokens) replay costs
	// under 5% of per-token snapshots, tree working states included.
	snap := SnapshotBytes(qwen36Shape(), 4, 2, 16)
	replay := ReplayBytes(qwen36Shape(), 4, 2, 16, true)
	if ratio := float64(replay) / float64(snap); ratio > 0.05 {
		t.Errorf("replay/snapshot = %.3f, want < 0.05", ratio)
	}
}

func TestStrategyRollbackBytes(t *testing.T) {
	s := qwen36Shape()
	cases := []struct {
		strategy    Strategy
		draftTokens int
		tree        bool
		want        int64
	}{
		{Snapshot, 16, true, SnapshotBytes(s, 4, 2, 16)},
		{Snapshot, 16, false, SnapshotBytes(s, 4, 2, 16)},
		{Replay, 16, true, ReplayBytes(s, 4, 2, 16, true)},
		{Replay, 16, false, ReplayBytes(s, 4, 2, 16, false)},
		{Replay, 0, true, 0}, // no speculation, nothing to roll back
		{Snapshot, 0, false, 0},
	}
	for _, c := range cases {
		if got := c.strategy.RollbackBytes(s, 4, 2, c.draftTokens, c.tree); got != c.want {
			t.Errorf("%v D=%d tree=%v: %d, want %d", c.strategy, c.draftTokens, c.tree, got, c.want)
		}
	}
	for _, st := range []Strategy{Replay, Snapshot} {
		text, err := st.MarshalText()
		if back, perr := ParseStrategy(string(text)); err != nil || perr != nil || back != st {
			t.Errorf("%v does not round-trip through its text %q", st, text)
		}
	}
}
