package engine

import (
	"context"
	"ddflash/kernels"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"ddflash/mamba"
)

// generateLogits runs a request like Generate (with its checkpoint
// prefill) and also returns every logit row the target produced for it (a
// copy), in order.
func generateLogits(t *testing.T, e *Engine, r Request) (*Result, [][]float32) {
	t.Helper()
	j, err := e.newJob(r)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		j.close()
		e.checkpointReply(context.Background(), r.Prompt, j.result().Tokens)
	}()
	var rows [][]float32
	for !j.done() {
		in, err := j.prepare(e.opts.PrefillChunk)
		if err != nil {
			t.Fatal(err)
		}
		out, err := e.forwardBatch([]*job{j}, []SeqInput{in}, j.taps())
		if err != nil {
			t.Fatal(err)
		}
		if len(out[0].Logits) > 0 {
			rows = append(rows, slices.Clone(out[0].Logits))
		}
		if err := j.complete(&out[0]); err != nil {
			t.Fatal(err)
		}
	}
	return j.result(), rows
}

// sameBits reports whether two logit sets are bit-identical, the first
// valid of each row (the real token ids) finite.
func sameBits(a, b [][]float32, valid int) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d logit steps against %d", len(a), len(b))
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return fmt.Errorf("step %d: %d logits against %d", i, len(a[i]), len(b[i]))
		}
		for k, x := range a[i] {
			if k < valid && (math.IsNaN(float64(x)) || math.IsInf(float64(x), 0)) {
				return fmt.Errorf("step %d logit %d is %v", i, k, x)
			}
			if math.Float32bits(x) != math.Float32bits(b[i][k]) {
				return fmt.Errorf("step %d logit %d: %v against %v", i, k, x, b[i][k])
			}
		}
	}
	return nil
}

// chat is a multi-turn workload over a shared system prompt: each turn's
// prompt is the previous prompt, its reply and a new user message; a second
// conversation shares the system prompt only.
type chat struct {
	system []int32
	rng    *rand.Rand
}

func (c *chat) user(n int) []int32 { return randomTokens(c.rng, n, 290) }

// TestPrefixCacheBitIdentical runs chats whose later turns (past the
// previous reply, thanks to its checkpoint prefill) and second
// conversation reuse cached prefixes, in every decoding mode, greedy and
// sampled, and checks every output token and every logit against the same
// requests on an engine without the cache: on the CPU backend they are
// bit-identical, with fp32 caches and states and with bf16 ones (serve's
// default KV and conv dtypes, and a bf16 recurrent state). It also checks
// what the cache reports it reused.
func TestPrefixCacheBitIdentical(t *testing.T) {
	const seed, ctxLen = 5, 256
	cacheDTypes := []Options{{}, {KVDType: kernels.BF16, ConvDType: kernels.BF16, SSMDType: SSMBF16}}
	for _, c := range []specCase{{SpecAuto, 0, mamba.Replay}, {SpecLinear, 0, mamba.Snapshot}, {SpecTree, 8, mamba.Replay}} {
		for _, sampled := range []bool{false, true} {
			for _, dt := range cacheDTypes {
				t.Run(fmt.Sprintf("%v-sampled=%v-kv=%v", c, sampled, dt.KVDType), func(t *testing.T) {
					testPrefixCacheBitIdentical(t, seed, ctxLen, c, sampled, dt)
				})
			}
		}
	}
}

func testPrefixCacheBitIdentical(t *testing.T, seed uint64, ctxLen int, c specCase, sampled bool, dtypes Options) {
	mk := func(slots int) *Engine {
		// A prefill chunk that is no multiple of the GDN chunk.
		opts := dtypes
		opts.PrefillChunk, opts.PrefixSlots = 100, slots
		return specEngineBlock(t, "tiny", seed, c, func(s []int32) int32 { return s[len(s)/2] }, 0.3, ctxLen, 8, opts)
	}
	on, off := mk(4), mk(0)
	ch := &chat{rng: rand.New(rand.NewPCG(3, 4))}
	ch.system = ch.user(90)
	sampling := SamplingParams{Logprobs: 2}
	if sampled {
		sampling = SamplingParams{Temperature: 0.8, TopK: 40, Seed: 17, Logprobs: 2}
	}
	prompt := concat(ch.system, ch.user(20))
	other := concat(ch.system, ch.user(30))
	type turn struct {
		prompt, reply []int32
		cached        int
	}
	var turns []turn
	for i := range 3 {
		r := Request{Prompt: prompt, MaxTokens: 24, Sampling: sampling, IgnoreEOS: true}
		got, gotRows := generateLogits(t, on, r)
		want, wantRows := generateLogits(t, off, r)
		if !slices.Equal(got.Tokens, want.Tokens) {
			t.Fatalf("turn %d: cached output %v, uncached %v", i, got.Tokens, want.Tokens)
		}
		if err := sameBits(gotRows, wantRows, on.ValidVocab); err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		turns = append(turns, turn{prompt, got.Tokens, got.Stats.CachedTokens})
		prompt = concat(concat(prompt, got.Tokens), ch.user(30))
	}
	// Turn 1 misses; later turns reuse the previous prompt and reply's
	// whole 64-token chunks (turn 2 more than the previous prompt's: the
	// reply crosses a chunk boundary). The other conversation reuses the
	// system prompt's.
	for i, tn := range turns {
		want := 0
		if i > 0 {
			prev := turns[i-1]
			want = (len(prev.prompt) + len(prev.reply)) / 64 * 64
			if i == 1 && want <= len(prev.prompt)/64*64 {
				t.Fatalf("test setup: turn 1's reply crosses no chunk boundary")
			}
		}
		if tn.cached != want {
			t.Fatalf("turn %d (prompt %d tokens) reused %d tokens, want %d", i, len(tn.prompt), tn.cached, want)
		}
	}
	r := Request{Prompt: other, MaxTokens: 8, Sampling: sampling, IgnoreEOS: true}
	got, gotRows := generateLogits(t, on, r)
	want, wantRows := generateLogits(t, off, r)
	if err := sameBits(gotRows, wantRows, on.ValidVocab); err != nil || !slices.Equal(got.Tokens, want.Tokens) {
		t.Fatalf("diverging conversation: %v; tokens %v against %v", err, got.Tokens, want.Tokens)
	}
	if got.Stats.CachedTokens != 64 {
		t.Fatalf("diverging conversation reused %d tokens, want the system prompt's 64", got.Stats.CachedTokens)
	}
	st := on.PrefixStats()
	if st.HitTokens == 0 || st.QueriedTokens <= st.HitTokens || st.Checkpoints == 0 {
		t.Fatalf("prefix stats %+v", st)
	}
}

// TestPrefixCacheTensorParallel compares cached and uncached chats on two
// tensor-parallel ranks, autoregressive and DDTree, logits bit for bit.
func TestPrefixCacheTensorParallel(t *testing.T) {
	dir := writeTestModel(t, "tiny", 8, "f32")
	for _, c := range []specCase{{SpecAuto, 0, mamba.Replay}, {SpecTree, 8, mamba.Snapshot}} {
		mk := func(slots int) *Engine {
			e := loadTP(t, dir, 2, Options{Context: 256, PrefillChunk: 64, PrefixSlots: slots, VerifyTokens: 9})
			setOracleDrafter(e, 8, c, func(s []int32) int32 { return s[len(s)-2] }, 0.3, 8)
			return e
		}
		on, off := mk(2), mk(0)
		ch := &chat{rng: rand.New(rand.NewPCG(5, 6))}
		prompt := ch.user(140)
		for i := range 3 {
			r := Request{Prompt: prompt, MaxTokens: 10, Sampling: SamplingParams{Logprobs: 1}, IgnoreEOS: true}
			got, gotRows := generateLogits(t, on, r)
			want, wantRows := generateLogits(t, off, r)
			if err := sameBits(gotRows, wantRows, on.ValidVocab); err != nil || !slices.Equal(got.Tokens, want.Tokens) {
				t.Fatalf("%v turn %d: %v; tokens %v against %v", c, i, err, got.Tokens, want.Tokens)
			}
			if i > 0 && got.Stats.CachedTokens == 0 {
				t.Fatalf("%v turn %d reused nothing", c, i)
			}
			prompt = concat(concat(prompt, got.Tokens), ch.user(7))
		}
	}
}

// TestPrefixCacheSchedulerMix runs many concurrent chats (greedy and
// seeded sampling) through the scheduler with a KV pool and checkpoint
// slots small enough that the cache evicts all along, in each decoding
// mode, and compares every output with
// the same request alone on an engine without the cache. At the end every
// page and slot is free or held by the cache, and evicting the cache frees
// them all.
func TestPrefixCacheSchedulerMix(t *testing.T) {
	const seed, ctxLen = 6, 256
	for _, c := range []specCase{{SpecAuto, 0, mamba.Replay}, {SpecTree, 8, mamba.Snapshot}} {
		t.Run(c.String(), func(t *testing.T) {
			ref := specEngineBlock(t, "tiny", seed, c, func(s []int32) int32 { return s[len(s)-1] }, 0.3, ctxLen, 8, Options{})
			rng := rand.New(rand.NewPCG(7, 8))
			systems := [][]int32{randomTokens(rng, 70, 290), randomTokens(rng, 130, 290)}
			var reqs []Request
			var answers [][]int32
			for i := range 24 {
				prompt := concat(systems[i%2], randomTokens(rng, 1+rng.IntN(40), 290))
				if i >= 4 && rng.IntN(2) == 0 { // the next turn of an earlier chat
					prev := answers[rng.IntN(len(answers))]
					if len(prev) < 200 {
						prompt = concat(prev, randomTokens(rng, 1+rng.IntN(10), 290))
					}
				}
				r := Request{Prompt: prompt, MaxTokens: 1 + rng.IntN(16), IgnoreEOS: true}
				if i%3 == 0 {
					r.Sampling = SamplingParams{Temperature: 0.9, Seed: uint64(i)}
				}
				res, err := ref.Generate(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				reqs = append(reqs, r)
				answers = append(answers, concat(prompt, res.Tokens))
			}
			// 3 running requests' worst cases fill about the whole pool.
			e := specEngineBlock(t, "tiny", seed, c, func(s []int32) int32 { return s[len(s)-1] }, 0.3, ctxLen, 8,
				Options{MaxSeqs: 3, KVTokens: 3 * (ctxLen + 16), PrefillChunk: 64, PrefixSlots: 3})
			s := runScheduler(t, e, SchedulerOptions{StepPrefill: 96, MaxQueue: 32})
			var wg sync.WaitGroup
			errs := make([]error, len(reqs))
			cached := 0
			var mu sync.Mutex
			for i := range reqs {
				wg.Go(func() {
					st, err := s.Submit(context.Background(), reqs[i])
					if err != nil {
						errs[i] = err
						return
					}
					res, err := st.Wait()
					if err == nil && !slices.Equal(res.Tokens, answers[i][len(reqs[i].Prompt):]) {
						err = fmt.Errorf("output %v, alone %v", res.Tokens, answers[i][len(reqs[i].Prompt):])
					}
					if err == nil {
						mu.Lock()
						cached += res.Stats.CachedTokens
						mu.Unlock()
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
			if cached == 0 {
				t.Fatal("no request reused a prefix")
			}
			checkNoLeaks(t, s, e)
		})
	}
}

// checkNoLeaks waits for the scheduler to go idle, then checks that every
// KV page and state slot is free or held by the prefix cache, and that
// evicting the whole cache leaves every page and slot free.
func checkNoLeaks(t *testing.T, s *Scheduler, e *Engine) {
	t.Helper()
	waitQuiet(t, s)
	// The step loop is idle: the engine's pools can be read.
	st := e.PrefixStats()
	kv, pool := e.Model.KV, e.Model.States
	if kv.FreePages()+int(st.Pages) != kv.Pages() || pool.Free()+int(st.Checkpoints) != pool.Slots() {
		t.Fatalf("free pages %d + cached %d of %d; free slots %d + checkpoints %d of %d",
			kv.FreePages(), st.Pages, kv.Pages(), pool.Free(), st.Checkpoints, pool.Slots())
	}
	if kv.IdleCachedPages() != int(st.Pages) {
		t.Fatalf("%d idle cached pages with no request running, want all %d cached pages", kv.IdleCachedPages(), st.Pages)
	}
	e.prefix.evict(e, kv.Pages())
	if kv.FreePages() != kv.Pages() || pool.Free() != pool.Slots() || e.prefix.held != 0 {
		t.Fatalf("after evicting the cache: %d of %d pages and %d of %d slots free", kv.FreePages(), kv.Pages(), pool.Free(), pool.Slots())
	}
}

// waitQuiet waits until the scheduler runs no request and no checkpoint
// prefill (the prefix cache may still hold pages and slots).
func waitQuiet(t *testing.T, s *Scheduler) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for st := s.State(); st.Running > 0 || st.Queued > 0 || st.Checkpointing > 0; st = s.State() {
		if time.Now().After(deadline) {
			t.Fatalf("the scheduler is still busy: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPrefixCacheSchedulerReply: through the scheduler, a chat's second turn
// reuses the first turn's prompt and reply up to their last whole 64-token
// chunk (stored by the checkpoint prefill the scheduler runs once the first
// turn ends), with the output of an engine without the cache.
func TestPrefixCacheSchedulerReply(t *testing.T) {
	const seed, ctxLen = 6, 256
	for _, c := range []specCase{{SpecAuto, 0, mamba.Replay}, {SpecTree, 8, mamba.Snapshot}} {
		t.Run(c.String(), func(t *testing.T) {
			mk := func(slots int) *Engine {
				return specEngineBlock(t, "tiny", seed, c, func(s []int32) int32 { return s[len(s)-1] }, 0.3, ctxLen, 8,
					Options{MaxSeqs: 2, PrefillChunk: 64, PrefixSlots: slots})
			}
			on, off := mk(2), mk(0)
			s := runScheduler(t, on, SchedulerOptions{})
			rng := rand.New(rand.NewPCG(12, 13))
			prompt := randomTokens(rng, 110, 290)
			for turn := range 2 {
				r := Request{Prompt: prompt, MaxTokens: 24, Sampling: SamplingParams{Temperature: 0.9, Seed: 3}, IgnoreEOS: true}
				want, err := off.Generate(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				st, err := s.Submit(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				got, err := st.Wait()
				if err != nil || !slices.Equal(got.Tokens, want.Tokens) {
					t.Fatalf("turn %d: %v; tokens %v against %v", turn, err, got.Tokens, want.Tokens)
				}
				if wantCached := []int{0, 128}[turn]; got.Stats.CachedTokens != wantCached {
					t.Fatalf("turn %d reused %d tokens, want %d", turn, got.Stats.CachedTokens, wantCached)
				}
				waitQuiet(t, s) // the checkpoint prefill of 110+24 tokens stores 128
				prompt = concat(concat(prompt, got.Tokens), randomTokens(rng, 10, 290))
			}
			checkNoLeaks(t, s, on)
		})
	}
}

func TestNextCheckpoint(t *testing.T) {
	for _, c := range []struct {
		pageSize, intervalPages, prefilled, n, want int
	}{
		{16, 0, 0, 200, 192},   // a prompt's last whole 64-token chunk
		{16, 0, 0, 63, 0},      // no whole chunk
		{16, 0, 192, 200, 0},   // already there
		{16, 0, 128, 256, 256}, // a prompt that ends on a chunk
		{16, 1, 0, 200, 64},    // 1 page rounds up to a chunk
		{16, 5, 0, 400, 128},   // 80 tokens round up to 128
		{16, 5, 128, 400, 256},
		{16, 5, 256, 400, 384},
		{16, 5, 256, 300, 0}, // the interval point 384 is past the end, and so is 256
		{48, 0, 0, 200, 192}, // pages of 48 and chunks of 64 meet every 192
		{48, 1, 0, 500, 192},
	} {
		cache := newPrefixCache(c.pageSize, 1, c.intervalPages)
		if got := cache.nextCheckpoint(c.prefilled, c.n); got != c.want {
			t.Errorf("%+v: next checkpoint %d, want %d", c, got, c.want)
		}
	}
}

// TestPrefixCheckpointInterval: with checkpoints every page (rounded to a
// 64-token chunk), a prompt that shares only the first 130 tokens of an
// earlier one reuses 128 of them, bit-identically.
func TestPrefixCheckpointInterval(t *testing.T) {
	on := newTestEngine(t, "tiny", 9, Options{Context: 256, PageSize: 16, PrefixSlots: 4, PrefixInterval: 1})
	off := newTestEngine(t, "tiny", 9, Options{Context: 256, PageSize: 16})
	rng := rand.New(rand.NewPCG(9, 10))
	first := randomTokens(rng, 200, 290)
	second := concat(first[:130], randomTokens(rng, 40, 290))
	for i, prompt := range [][]int32{first, second} {
		r := Request{Prompt: prompt, MaxTokens: 6, Sampling: SamplingParams{Logprobs: 1}}
		got, gotRows := generateLogits(t, on, r)
		want, wantRows := generateLogits(t, off, r)
		if err := sameBits(gotRows, wantRows, on.ValidVocab); err != nil || !slices.Equal(got.Tokens, want.Tokens) {
			t.Fatalf("prompt %d: %v; tokens %v against %v", i, err, got.Tokens, want.Tokens)
		}
		if wantCached := []int{0, 128}[i]; got.Stats.CachedTokens != wantCached {
			t.Fatalf("prompt %d reused %d tokens, want %d", i, got.Stats.CachedTokens, wantCached)
		}
	}
	// 64, 128 and 192 from the first; the second has no whole chunk past 128.
	if c := on.PrefixStats().Checkpoints; c != 3 {
		t.Fatalf("%d checkpoints, want 3", c)
	}
}

// TestIdleCachedPages: the cached pages that a running request shares are
// in use, the others idle (what vllm:kv_cache_usage_perc leaves out), and
// evicting the cache leaves none.
func TestIdleCachedPages(t *testing.T) {
	e := newTestEngine(t, "tiny", 9, Options{Context: 256, PageSize: 16, PrefixSlots: 2})
	rng := rand.New(rand.NewPCG(3, 4))
	first := randomTokens(rng, 140, 290)
	if _, err := e.Generate(context.Background(), Request{Prompt: first, MaxTokens: 4}); err != nil {
		t.Fatal(err)
	}
	kv, cached := e.Model.KV, int(e.PrefixStats().Pages)
	if cached == 0 || kv.IdleCachedPages() != cached {
		t.Fatalf("after a request: %d idle cached pages, want all %d cached pages", kv.IdleCachedPages(), cached)
	}
	j, err := e.newJob(Request{Prompt: concat(first[:130], randomTokens(rng, 20, 290)), MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	shared := j.out.res.Stats.CachedTokens / kv.PageSize()
	if shared == 0 || kv.IdleCachedPages() != cached-shared {
		t.Fatalf("a request sharing %d cached pages: %d idle, want %d", shared, kv.IdleCachedPages(), cached-shared)
	}
	j.close()
	if kv.IdleCachedPages() != cached {
		t.Fatalf("after the request: %d idle cached pages, want %d", kv.IdleCachedPages(), cached)
	}
	e.SetPrefixCache(false)
	if kv.IdleCachedPages() != 0 || kv.FreePages() != kv.Pages() {
		t.Fatalf("cache off: %d idle cached pages, %d of %d free", kv.IdleCachedPages(), kv.FreePages(), kv.Pages())
	}
}

// TestPrefixCacheAcrossModes: prefixes cached by autoregressive requests
// lack the drafter features speculation needs, so a speculative request
// does not reuse them but adds the features; the next one reuses them, and
// an autoregressive request reuses what speculative ones cached. Outputs
// equal an engine's without the cache throughout.
func TestPrefixCacheAcrossModes(t *testing.T) {
	const seed = 4
	linear := specCase{SpecLinear, 0, mamba.Replay}
	mk := func(slots int) *Engine {
		return specEngineBlock(t, "tiny", seed, linear, func(s []int32) int32 { return s[len(s)/3] }, 0.3, 256, 8, Options{PrefixSlots: slots})
	}
	on, off := mk(4), mk(0)
	rng := rand.New(rand.NewPCG(4, 5))
	prompt := randomTokens(rng, 100, 290)
	for i, c := range []struct {
		mode   SpecMode
		cached int
	}{{SpecAuto, 0}, {SpecLinear, 0}, {SpecLinear, 64}, {SpecAuto, 64}} {
		on.Spec.Mode, off.Spec.Mode = c.mode, c.mode
		r := Request{Prompt: prompt, MaxTokens: 8}
		got, err := on.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		want, err := off.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Tokens, want.Tokens) || got.Stats.CachedTokens != c.cached {
			t.Fatalf("request %d (%v): tokens %v against %v, %d cached (want %d)", i, c.mode, got.Tokens, want.Tokens, got.Stats.CachedTokens, c.cached)
		}
		prompt = append(prompt, randomTokens(rng, 3, 290)...)
	}
}

// TestSchedulerDropsCheckpointPrefill: a checkpoint prefill that holds the
// only state slot is ended as soon as a request waits for the slot; the
// request then runs as on an engine without the cache, and nothing leaks.
// It steps the scheduler by hand, so that the request arrives midway.
func TestSchedulerDropsCheckpointPrefill(t *testing.T) {
	mk := func(slots int) *Engine {
		return newTestEngine(t, "tiny", 9, Options{Context: 256, MaxSeqs: 1, PrefillChunk: 64, PrefixSlots: slots})
	}
	on, off := mk(1), mk(0)
	rng := rand.New(rand.NewPCG(14, 15))
	s := NewScheduler(on, SchedulerOptions{})
	s.replies = [][]int32{randomTokens(rng, 150, 290)}
	running, reserved := s.admit(nil, 0)
	running, reserved = s.step(running, reserved) // the first 64 of its 128 tokens
	if len(running) != 1 || !running[0].job.checkpointOnly {
		t.Fatalf("%d running, want the checkpoint prefill", len(running))
	}
	r := Request{Prompt: randomTokens(rng, 80, 290), MaxTokens: 6}
	st, err := s.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if running, reserved = s.round(running, reserved); len(s.waiting) > 0 {
		t.Fatal("the request waits while a checkpoint prefill holds the slot")
	}
	for len(running) > 0 || len(s.waiting) > 0 || len(s.replies) > 0 {
		running, reserved = s.round(running, reserved)
	}
	got, err := st.Wait()
	if err != nil {
		t.Fatal(err)
	}
	want, err := off.Generate(context.Background(), r)
	if err != nil || !slices.Equal(got.Tokens, want.Tokens) {
		t.Fatalf("%v; tokens %v against %v", err, got.Tokens, want.Tokens)
	}
	s.publish(nil)
	checkNoLeaks(t, s, on)
}
