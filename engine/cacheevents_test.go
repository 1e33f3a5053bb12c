package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
)

// advertised is what a subscriber to the cache events knows: the blocks
// stored and not removed since, and which of them ended a stored run.
type advertised struct {
	parent map[uint64]uint64
	tokens map[uint64][]int32
	ends   map[uint64]bool
}

func (a *advertised) apply(t *testing.T, ev CacheEvent, pageSize int) {
	t.Helper()
	switch ev.Kind {
	case BlocksStored:
		if ev.Parent != 0 && a.tokens[ev.Parent] == nil {
			t.Fatalf("stored blocks %v after block %d, which is not cached", ev.Blocks, ev.Parent)
		}
		if ev.BlockSize != pageSize || len(ev.Tokens) != len(ev.Blocks)*pageSize {
			t.Fatalf("stored %d blocks of %d tokens with %d tokens, want pages of %d", len(ev.Blocks), ev.BlockSize, len(ev.Tokens), pageSize)
		}
		parent := ev.Parent
		for i, id := range ev.Blocks {
			if id == 0 || a.tokens[id] != nil {
				t.Fatalf("stored block ID %d, which is 0 or cached already", id)
			}
			a.parent[id], a.tokens[id] = parent, ev.Tokens[i*pageSize:(i+1)*pageSize]
			parent = id
		}
		a.ends[parent] = true
	case BlocksRemoved:
		for _, id := range ev.Blocks {
			if a.tokens[id] == nil {
				t.Fatalf("removed block %d, which is not cached", id)
			}
			delete(a.parent, id)
			delete(a.tokens, id)
			delete(a.ends, id)
		}
	default:
		t.Fatalf("event kind %d", ev.Kind)
	}
}

// prefix is the tokens from the prompt's start to the end of block id.
func (a *advertised) prefix(id uint64) []int32 {
	var blocks [][]int32
	for ; id != 0; id = a.parent[id] {
		blocks = append(blocks, a.tokens[id])
	}
	slices.Reverse(blocks)
	return slices.Concat(blocks...)
}

// TestCacheEventsTrackResumablePrefixes runs conversations that share
// prefixes and overflow the cache's two checkpoints, and checks after each
// request that the blocks the events advertise are exactly the pages the
// cache holds, chained to blocks advertised before, and that each stored
// run ends where the cache resumes a prompt in full.
func TestCacheEventsTrackResumablePrefixes(t *testing.T) {
	const pageSize = 16
	e := newTestEngine(t, "tiny", 9, Options{Context: 256, PageSize: pageSize, PrefixSlots: 2})
	a := advertised{parent: map[uint64]uint64{}, tokens: map[uint64][]int32{}, ends: map[uint64]bool{}}
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
			a.apply(t, ev, pageSize)
			if ev.Kind == BlocksRemoved {
				removed++
			}
		}
		events = nil
		if held := int(e.PrefixStats().Pages); held != len(a.tokens) {
			t.Fatalf("round %d: the cache holds %d pages, the events advertise %d", round, held, len(a.tokens))
		}
		for id := range a.ends {
			p := a.prefix(id)
			if h := e.prefix.tree.Match(p); h.Tokens != len(p) {
				t.Fatalf("round %d: advertised prefix of %d tokens resumes %d", round, len(p), h.Tokens)
			}
		}
	}
	if removed == 0 || len(a.ends) == 0 {
		t.Fatalf("%d removals, %d prefixes advertised: the test exercised nothing", removed, len(a.ends))
	}
	e.SetPrefixCache(false)
	for _, ev := range events {
		a.apply(t, ev, pageSize)
	}
	if len(a.tokens) != 0 {
		t.Fatalf("the cache is off and %d blocks are still advertised", len(a.tokens))
	}
}
