package engine

import (
	"math/rand/v2"
	"testing"

	"ddflash/mamba"
)

// verifyThenCommit prefills prompt, verifies block (a chain when parents is
// nil) with the given rollback strategy, commits path, and returns the verify
// logits (all rows) and the engine with its sequence.
func verifyThenCommit(t *testing.T, strategy mamba.Strategy, prompt, block, parents, path []int32) ([]float32, *Engine, *sequence) {
	t.Helper()
	e := newTestEngine(t, "tiny", 11, Options{PageSize: 4})
	s, err := e.newSequence()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.prefill(s, prompt, nil); err != nil {
		t.Fatal(err)
	}
	spec, err := mamba.NewVerify(e.Model.States, strategy, len(block))
	if err != nil {
		t.Fatal(err)
	}
	defer spec.Close()
	if err := e.Model.KV.Reserve(&s.kv, s.len+len(block)); err != nil {
		t.Fatal(err)
	}
	out, err := e.Model.Forward([]SeqInput{{Tokens: block, Start: s.len, KV: &s.kv, Slot: s.slot, Logits: AllRows, Parents: parents, Spec: spec}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Commit(e.Model.States, s.slot, path); err != nil {
		t.Fatal(err)
	}
	if err := e.Model.CommitKV(&s.kv, s.len, path); err != nil {
		t.Fatal(err)
	}
	s.len += len(path)
	e.Model.KV.Truncate(&s.kv, s.len)
	return out[0].Logits, e, s
}

// autoregressive feeds tokens one by one and returns each step's logits and
// the final engine state.
func autoregressive(t *testing.T, tokens []int32) ([][]float32, *Engine, *sequence) {
	t.Helper()
	e := newTestEngine(t, "tiny", 11, Options{PageSize: 4})
	s, err := e.newSequence()
	if err != nil {
		t.Fatal(err)
	}
	var all [][]float32
	for _, tok := range tokens {
		l, err := e.step(s, tok)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, l)
	}
	return all, e, s
}

// TestChainRollbackEveryAcceptLength forces every acceptance length of a
// 16-token block and checks the committed GDN state against autoregressive
// decoding of the accepted tokens, for both rollback strategies; then checks
// that decoding continues identically.
func TestChainRollbackEveryAcceptLength(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	prompt := randomTokens(rng, 9, 290)
	block := randomTokens(rng, 16, 290)
	for _, strategy := range []mamba.Strategy{mamba.Replay, mamba.Snapshot} {
		for a := 0; a < len(block); a++ {
			path := make([]int32, a+1)
			for i := range path {
				path[i] = int32(i)
			}
			verifyLogits, e, s := verifyThenCommit(t, strategy, prompt, block, nil, path)
			arLogits, ar, as := autoregressive(t, append(append([]int32{}, prompt...), block[:a+1]...))
			V := e.Model.Cfg.VocabSize
			for r := 0; r <= a; r++ {
				if d := maxAbsDiff(verifyLogits[r*V:(r+1)*V], arLogits[len(prompt)+r]); d > 1e-5 {
					t.Fatalf("%v a=%d: verify row %d logits differ from autoregressive by %g", strategy, a, r, d)
				}
			}
			if d := maxAbsDiff(stateOf(t, e, s.slot), stateOf(t, ar, as.slot)); d > 1e-6 {
				t.Fatalf("%v a=%d: committed GDN state differs from autoregressive by %g (bound 1e-6)", strategy, a, d)
			}
			next := block[(a+1)%len(block)]
			got, err := e.step(s, next)
			if err != nil {
				t.Fatal(err)
			}
			want, err := ar.step(as, next)
			if err != nil {
				t.Fatal(err)
			}
			if d := maxAbsDiff(got, want); d > 1e-5 {
				t.Fatalf("%v a=%d: next step after commit differs by %g", strategy, a, d)
			}
		}
	}
}

// randomTree returns parents for n tokens: token 0 is the root, every other
// token hangs under a random earlier one.
func randomTree(rng *rand.Rand, n int) []int32 {
	p := make([]int32, n)
	p[0] = -1
	for i := 1; i < n; i++ {
		p[i] = int32(rng.IntN(i))
	}
	return p
}

// TestTreeVerifyMatchesPaths checks tree verification: every node's logits
// equal autoregressive decoding of its root-to-node path, and committing a
// node's path (KV compaction and GDN state) equals decoding that path.
func TestTreeVerifyMatchesPaths(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	prompt := randomTokens(rng, 6, 290)
	block := randomTokens(rng, 12, 290)
	parents := randomTree(rng, len(block))
	pathTo := func(node int) []int32 {
		var rev []int32
		for n := node; n >= 0; n = int(parents[n]) {
			rev = append(rev, int32(n))
		}
		for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
			rev[i], rev[j] = rev[j], rev[i]
		}
		return rev
	}
	for _, strategy := range []mamba.Strategy{mamba.Replay, mamba.Snapshot} {
		for node := 0; node < len(block); node++ {
			path := pathTo(node)
			verifyLogits, e, s := verifyThenCommit(t, strategy, prompt, block, parents, path)
			var tokens []int32
			for _, n := range path {
				tokens = append(tokens, block[n])
			}
			arLogits, ar, as := autoregressive(t, append(append([]int32{}, prompt...), tokens...))
			V := e.Model.Cfg.VocabSize
			if d := maxAbsDiff(verifyLogits[node*V:(node+1)*V], arLogits[len(arLogits)-1]); d > 1e-5 {
				t.Fatalf("%v node %d: tree logits differ from its path's by %g", strategy, node, d)
			}
			if d := maxAbsDiff(stateOf(t, e, s.slot), stateOf(t, ar, as.slot)); d > 1e-6 {
				t.Fatalf("%v node %d: committed GDN state differs by %g", strategy, node, d)
			}
			got, err := e.step(s, 7)
			if err != nil {
				t.Fatal(err)
			}
			want, err := ar.step(as, 7)
			if err != nil {
				t.Fatal(err)
			}
			if d := maxAbsDiff(got, want); d > 1e-5 {
				t.Fatalf("%v node %d: step after tree commit differs by %g (KV compaction)", strategy, node, d)
			}
		}
	}
}
