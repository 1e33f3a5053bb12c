package engine

import (
	"context"
	"slices"
	"testing"

	"ddflash/ddtree"
	"ddflash/mamba"
)

// latticeOracle is an oracle drafter whose logits mislead (the target's
// token is never their argmax) and whose lattice leads to the target's
// tokens only through the predecessor: at every depth the candidates are
// [decoy, target's token, decoy], and the target's token scores highest
// after the anchor or the previous depth's target token, a decoy after a
// decoy or when the predecessor is ignored (row 0 at later depths).
type latticeOracle struct{ *oracleDrafter }

func (o latticeOracle) NewSession(prompt []int32) (DraftSession, error) {
	return &latticeOracleSession{oracleSession: &oracleSession{o: o.oracleDrafter, prompt: prompt}}, nil
}

type latticeOracleSession struct {
	*oracleSession
	lattice *ddtree.Lattice
}

func (s *latticeOracleSession) Lattice() *ddtree.Lattice { return s.lattice }

func (s *latticeOracleSession) Draft(features []float32, anchor int32) ([]float32, error) {
	logits, err := s.oracleSession.Draft(features, anchor)
	if err != nil {
		return nil, err
	}
	V, valid := s.o.vocab, s.o.valid
	s.lattice = &ddtree.Lattice{}
	for d, tok := range s.proposed[1:] {
		row := logits[d*V : (d+1)*V]
		row[tok] = -10
		decoys := []int32{(tok + 1) % int32(valid), (tok + 2) % int32(valid)}
		s.lattice.Tokens = append(s.lattice.Tokens, []int32{decoys[0], tok, decoys[1]})
		follows := []float64{0, 3, 1} // after the target's previous token (or the anchor)
		misled := []float64{3, 0, 1}  // after a decoy
		if d == 0 {
			s.lattice.Scores = append(s.lattice.Scores, [][]float64{follows})
		} else {
			s.lattice.Scores = append(s.lattice.Scores, [][]float64{misled, follows, misled})
		}
	}
	return logits, nil
}

// TestProposalsFollowTheLattice checks that a LatticeSession's proposals
// come from its lattice, read through the predecessor: with an exact
// lattice behind misleading logits, linear decoding (the greedy walk) and
// DDTree (chain-seeded, and purely best-first by selector log-probability)
// accept every drafted token, and the output is autoregressive's.
func TestProposalsFollowTheLattice(t *testing.T) {
	const seed, block = 5, 6
	ref := newTestEngine(t, "tiny", seed, Options{})
	oracle := greedyOracle(t, ref)
	req := Request{Prompt: []int32{4, 77, 190, 12}, MaxTokens: 31, IgnoreEOS: true}
	want, err := ref.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spec        specCase
		noChainSeed bool
	}{
		{specCase{SpecLinear, 0, mamba.Replay}, false},
		{specCase{SpecTree, 8, mamba.Snapshot}, false},
		{specCase{SpecTree, 8, mamba.Replay}, true},
	} {
		e := specEngineBlock(t, "tiny", seed, c.spec, oracle, 0, 256, block, Options{})
		e.Drafter = latticeOracle{e.Drafter.(*oracleDrafter)}
		e.Spec.NoChainSeed = c.noChainSeed
		got, err := e.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Tokens, want.Tokens) {
			t.Fatalf("%v (no chain seed %v): output differs from autoregressive\n got %v\nwant %v", c.spec, c.noChainSeed, got.Tokens, want.Tokens)
		}
		if tau := got.Stats.SpecStats.AcceptanceLength; tau != block {
			t.Fatalf("%v (no chain seed %v): τ %.2f, want %d: the proposals did not follow the lattice", c.spec, c.noChainSeed, tau, block)
		}
	}
}
