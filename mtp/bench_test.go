package mtp

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"ddflash/engine"
	"ddflash/engine/testmodel"
	"ddflash/kernels/cpu"
)

// BenchmarkDraftSmall times one steady draft (one committed row, then the
// steps) of the small preset's random MTP head, per step count, beside one
// target decode step, so the two compare as ratios within one run.
func BenchmarkDraftSmall(b *testing.B) {
	p, err := testmodel.PresetByName("small")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	if err := testmodel.Write(dir, testmodel.Options{Preset: p, Seed: 1, DType: "bf16", MTP: true}); err != nil {
		b.Fatal(err)
	}
	e, err := engine.Load(cpu.New(0), dir, engine.Options{Context: 1024, VerifyTokens: MaxSteps + 1})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	h, err := LoadFor(e, dir)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	row := make([]float32, p.Hidden)
	for i := range row {
		row[i] = float32(rng.NormFloat64())
	}
	b.Run("target-step", func(b *testing.B) {
		slot, err := e.Model.States.Acquire()
		if err != nil {
			b.Fatal(err)
		}
		defer e.Model.States.Release(slot)
		var kv engine.SeqKV
		defer e.Model.KV.Truncate(&kv, 0)
		for i := range b.N {
			pos := i % 1000
			if err := e.Model.KV.Reserve(&kv, pos+1); err != nil {
				b.Fatal(err)
			}
			in := engine.SeqInput{Tokens: []int32{int32(i % 300)}, Start: pos, KV: &kv, Slot: slot, Logits: engine.LastRow}
			if _, err := e.Model.Forward([]engine.SeqInput{in}, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, steps := range []int{1, 3, 4} {
		b.Run(fmt.Sprintf("steps%d", steps), func(b *testing.B) {
			d, err := h.Drafter(steps)
			if err != nil {
				b.Fatal(err)
			}
			s, err := d.NewSession(nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ts := s.(engine.TokenDraftSession)
			for i := range b.N {
				if i%1000 == 0 { // stay inside the context
					s.Close()
					s, _ = d.NewSession(nil)
					ts = s.(engine.TokenDraftSession)
				}
				if _, err := ts.DraftTokens(row, []int32{int32(i % 300)}, 7); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
