package engine

import (
	"context"
	"math/rand/v2"
	"testing"

	"ddflash/kvevents/kveventstest"
)

// wireEvent is an engine event as a router decodes it from the wire.
func wireEvent(ev CacheEvent) kveventstest.Event {
	kind := map[CacheEventKind]string{BlocksStored: "BlockStored", BlocksRemoved: "BlockRemoved"}[ev.Kind]
	return kveventstest.Event{Kind: kind, Hashes: ev.Blocks, Parent: ev.Parent, Tokens: ev.Tokens, BlockSize: ev.BlockSize}
}

// TestCacheEventsTrackResumablePrefixes runs conversations that share
// prefixes and overflow the cache's two checkpoints, and checks after each
// request that the blocks the events advertise are exactly the pages the
// cache holds, chained to blocks advertised before, and that each stored
// run ends where the cache resumes a prompt in full.
func TestCacheEventsTrackResumablePrefixes(t *testing.T) {
	const pageSize = 16
	e := newTestEngine(t, "tiny", 9, Options{Context: 256, PageSize: pageSize, PrefixSlots: 2})
	index := kveventstest.NewIndex()
	var events []CacheEvent
	e.SetCacheEvents(func(ev CacheEvent) { events = append(events, ev) })
	rng := rand.New(rand.NewPCG(7, 8))
	var prompts [][]int32
	removed := 0
	for round := range 10 {
		prompt := randomTokens(rng, 70+rng.IntN(60), 290)
		if len(prompts) > 0 && round%3 != 0 { // continue an earlier conversation
			prev := prompts[rng.IntN(len(prompts))]
			prompt = concat(prev[:min(len(prev), 64+rng.IntN(100))], randomTokens(rng, 20, 290))
		}
		prompt = prompt[:min(len(prompt), 200)]
		res, err := e.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		prompts = append(prompts, concat(prompt, res.Tokens))
		for _, ev := range events {
			if ev.BlockSize != 0 && ev.BlockSize != pageSize {
				t.Fatalf("blocks of %d tokens, want pages of %d", ev.BlockSize, pageSize)
			}
			if err := index.Apply(wireEvent(ev)); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			if ev.Kind == BlocksRemoved {
				removed++
			}
		}
		events = nil
		if held := int(e.PrefixStats().Pages); held != index.Blocks() {
			t.Fatalf("round %d: the cache holds %d pages, the events advertise %d", round, held, index.Blocks())
		}
		for _, p := range index.Prefixes() {
			if h := e.prefix.tree.Match(p); h.Tokens != len(p) {
				t.Fatalf("round %d: advertised prefix of %d tokens resumes %d", round, len(p), h.Tokens)
			}
		}
	}
	if removed == 0 || len(index.Prefixes()) == 0 {
		t.Fatalf("%d removals, %d prefixes advertised: the test exercised nothing", removed, len(index.Prefixes()))
	}
	e.SetPrefixCache(false)
	for _, ev := range events {
		if err := index.Apply(wireEvent(ev)); err != nil {
			t.Fatal(err)
		}
	}
	if index.Blocks() != 0 {
		t.Fatalf("the cache is off and %d blocks are still advertised", index.Blocks())
	}
}
