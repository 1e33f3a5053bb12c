package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/mamba"
)

// tokenOracle is an oracle drafter whose sessions are TokenDraftSessions
// (as the MTP head's): they record every token the engine pairs with their
// feature rows.
type tokenOracle struct{ *oracleDrafter }

func (o tokenOracle) NewSession(prompt []int32) (DraftSession, error) {
	return &tokenSession{oracleSession: oracleSession{o: o.oracleDrafter, prompt: prompt}}, nil
}

type tokenSession struct {
	oracleSession
	received []int32 // the tokens of every row so far, in order
	err      error   // the first row/token mismatch
}

func (s *tokenSession) DraftTokens(features []float32, tokens []int32, anchor int32) ([]float32, error) {
	if rows := len(features) / (len(s.o.taps) * s.o.hidden); rows != len(tokens) && s.err == nil {
		s.err = fmt.Errorf("%d feature rows with %d tokens", rows, len(tokens))
	}
	s.received = append(s.received, tokens...)
	return s.Draft(features, anchor)
}

// TestTokenSessionsGetCommittedTokens: a TokenDraftSession receives, over
// its drafts, exactly the committed sequence (prompt, then output) one
// token per feature row, each draft's rows continuing with the previous
// anchor; in linear and tree modes with partial acceptance, and with the
// prompt's start restored from the prefix cache.
func TestTokenSessionsGetCommittedTokens(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	prompt := randomTokens(rng, 70, 290) // past one 64-token checkpoint
	req := Request{Prompt: prompt, MaxTokens: 30}
	ar, err := newTestEngine(t, "tiny", 3, Options{Context: 128}).Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	full := concat(prompt, ar.Tokens)
	for _, c := range []specCase{{SpecLinear, 0, mamba.Replay}, {SpecTree, 8, mamba.Snapshot}} {
		e := newTestEngine(t, "tiny", 3, Options{Context: 128, PageSize: 4, VerifyTokens: 17, PrefixSlots: 2})
		setOracleDrafter(e, 3, c, pathOracle(full), 0.3, 8)
		oracle := tokenOracle{e.Drafter.(*oracleDrafter)}
		var sessions []*tokenSession
		e.Drafter = recordingDrafter{tokenOracle: oracle, sessions: &sessions}
		for pass := range 2 { // the second pass reuses the first's prompt checkpoint
			got, err := e.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Tokens, ar.Tokens) {
				t.Fatalf("%v pass %d: output differs from autoregressive", c, pass)
			}
			if pass == 1 && got.Stats.CachedTokens == 0 {
				t.Fatalf("%v: the second pass reused no cached prompt tokens", c)
			}
			s := sessions[len(sessions)-1]
			if s.err != nil {
				t.Fatalf("%v pass %d: %v", c, pass, s.err)
			}
			if n := len(s.received); n < len(prompt) || !slices.Equal(s.received, full[:n]) {
				t.Fatalf("%v pass %d: rows' tokens %v, want a prefix of the committed sequence %v", c, pass, s.received, full)
			}
			if got.Stats.AcceptanceLength <= 1.2 {
				t.Fatalf("%v: τ %.2f, the test does not exercise acceptance", c, got.Stats.AcceptanceLength)
			}
		}
	}
}

// recordingDrafter keeps each session it starts.
type recordingDrafter struct {
	tokenOracle
	sessions *[]*tokenSession
}

func (r recordingDrafter) NewSession(prompt []int32) (DraftSession, error) {
	s, _ := r.tokenOracle.NewSession(prompt)
	*r.sessions = append(*r.sessions, s.(*tokenSession))
	return s, nil
}
