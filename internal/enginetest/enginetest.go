// Package enginetest holds test helpers that drive an engine.Engine, shared
// by the drafter packages' tests.
package enginetest

import (
	"context"
	"slices"
	"testing"

	"ddflash/engine"
)

// TappedFeatures runs the target over tokens (a fresh sequence) and returns
// each token's tapped hidden states concatenated in tap order (a drafter's
// input rows).
func TappedFeatures(t *testing.T, e *engine.Engine, tokens []int32, taps []int) []float32 {
	t.Helper()
	m := e.Model
	slot, err := m.States.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer m.States.Release(slot)
	var kv engine.SeqKV
	if err := m.KV.Reserve(&kv, len(tokens)); err != nil {
		t.Fatal(err)
	}
	defer m.KV.Truncate(&kv, 0)
	out, err := m.Forward([]engine.SeqInput{{Tokens: tokens, KV: &kv, Slot: slot, Logits: engine.NoRows}}, taps)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(out[0].Features) // the model's buffer: the next forward reuses it
}

// Batched runs reqs at once through a scheduler on e and returns their
// results in order.
func Batched(t *testing.T, e *engine.Engine, reqs []engine.Request) []*engine.Result {
	t.Helper()
	s := engine.NewScheduler(e, engine.SchedulerOptions{})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { stop(); <-done }()
	var streams []*engine.Stream
	for _, r := range reqs {
		st, err := s.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	var out []*engine.Result
	for _, st := range streams {
		res, err := st.Wait()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, res)
	}
	return out
}
