package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"ddflash/adaptive"
	"ddflash/kernels"
	"ddflash/mamba"
)

// absorbingOracle is an oracle drafter whose sessions are TapAbsorbers:
// they record every feature row they get, from Draft or Absorb, in order.
type absorbingOracle struct {
	*oracleDrafter
	b        kernels.Backend
	sessions *[]*absorbingSession
}

func (o absorbingOracle) NewSession(prompt []int32) (DraftSession, error) {
	s := &absorbingSession{oracleSession: oracleSession{o: o.oracleDrafter, prompt: prompt}, b: o.b}
	*o.sessions = append(*o.sessions, s)
	return s, nil
}

type absorbingSession struct {
	oracleSession
	b        kernels.Backend
	pending  []float32 // rows absorbed since the last draft
	received []float32 // every row so far
	absorbs  int
}

func (s *absorbingSession) Absorb(features []float32, taps kernels.Buffer, rows []int32) error {
	s.absorbs++
	width := len(s.o.taps) * s.o.hidden
	s.pending = append(s.pending, features...)
	for _, r := range rows {
		row := make([]float32, width)
		if err := s.b.DownloadF32(taps, int(r)*width, row); err != nil {
			return err
		}
		s.pending = append(s.pending, row...)
	}
	return nil
}

func (s *absorbingSession) Draft(features []float32, anchor int32) ([]float32, error) {
	rows := append(s.pending, features...)
	s.pending = nil
	s.received = append(s.received, rows...)
	return s.oracleSession.Draft(rows, anchor)
}

// TestDeviceTapsReachTheSession: with Engine.DeviceTaps a TapAbsorber gets,
// over Absorb and Draft, the very feature rows in the very order that it
// gets through Draft alone when taps come home: the prompt's, then each
// verify's accepted rows, so its drafts and the acceptance are the same;
// under an adaptive policy whose first decoding step is plain (the prompt's
// rows still waiting for a draft when the step's rows are handed over) the
// rows are a prefix of the same sequence, and the output is autoregressive.
func TestDeviceTapsReachTheSession(t *testing.T) {
	prompt := []int32{12, 40, 7, 99, 3, 250, 18, 5, 61, 33, 2}
	req := Request{Prompt: prompt, MaxTokens: 40}
	ar, err := newTestEngine(t, "tiny", 3, Options{Context: 128}).Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	run := func(c specCase, policy *adaptive.Policy, onDevice bool) (*Result, *absorbingSession) {
		e := specEngine(t, 3, c, pathOracle(concat(prompt, ar.Tokens)), 0.3, 128)
		e.Spec.Policy, e.DeviceTaps = policy, onDevice
		var sessions []*absorbingSession
		e.Drafter = absorbingOracle{oracleDrafter: e.Drafter.(*oracleDrafter), b: e.Model.Backend(), sessions: &sessions}
		res, err := e.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Tokens, ar.Tokens) {
			t.Fatalf("%v, taps on the device %v: output differs from autoregressive", c, onDevice)
		}
		return res, sessions[len(sessions)-1] // the request's: measuring a policy's costs drafts first
	}
	for _, c := range []specCase{{SpecLinear, 0, mamba.Replay}, {SpecTree, 8, mamba.Snapshot}} {
		host, hostSession := run(c, nil, false)
		device, deviceSession := run(c, nil, true)
		if hostSession.absorbs != 0 || deviceSession.absorbs == 0 {
			t.Fatalf("%v: %d and %d absorbs with taps brought home and kept on the device, want none and some", c, hostSession.absorbs, deviceSession.absorbs)
		}
		if !slices.Equal(deviceSession.received, hostSession.received) {
			t.Fatalf("%v: the session got %d feature values with taps on the device, %d others with taps brought home", c, len(deviceSession.received), len(hostSession.received))
		}
		if !slices.Equal(device.Stats.SpecStats.AcceptanceLengths, host.Stats.SpecStats.AcceptanceLengths) {
			t.Fatalf("%v: acceptance %v with taps on the device, %v brought home", c, device.Stats.SpecStats.AcceptanceLengths, host.Stats.SpecStats.AcceptanceLengths)
		}
		if host.Stats.AcceptanceLength < 1.5 {
			t.Fatalf("%v: τ %.2f, too little accepted to exercise paths of several rows", c, host.Stats.AcceptanceLength)
		}
		if c.mode != SpecTree { // an adaptive policy sizes trees
			continue
		}
		_, adaptiveSession := run(c, &adaptive.Policy{Autoregressive: true}, true)
		got, all := adaptiveSession.received, hostSession.received
		if len(got) == 0 || !slices.Equal(got[:min(len(got), len(all))], all[:min(len(got), len(all))]) {
			t.Fatalf("%v adaptive: the session's %d feature values are not a prefix of the committed rows' %d", c, len(got), len(all))
		}
	}
}

// TestDeviceTapsReachBatchedSessions: batched (prompt chunks beside
// verifies, each sequence's rows at its own place in the step's tap
// buffer), every request's session gets the same feature rows with taps on
// the device as brought home, and the output is autoregressive.
func TestDeviceTapsReachBatchedSessions(t *testing.T) {
	const seed, ctxLen = 6, 128
	rng := rand.New(rand.NewPCG(13, 14))
	reqs, answers := randomRequests(t, newTestEngine(t, "tiny", seed, Options{Context: ctxLen}), rng, 6, 40, 30)
	c := specCase{SpecTree, 8, mamba.Replay}
	var received [2]map[string][]float32 // by prompt
	for i, onDevice := range []bool{false, true} {
		e := specEngineBlock(t, "tiny", seed, c, pathOracle(answers...), 0.2, ctxLen, 16, Options{MaxSeqs: 4, PrefillChunk: 16})
		e.DeviceTaps = onDevice
		var sessions []*absorbingSession
		e.Drafter = absorbingOracle{oracleDrafter: e.Drafter.(*oracleDrafter), b: e.Model.Backend(), sessions: &sessions}
		s := runScheduler(t, e, SchedulerOptions{StepPrefill: 24})
		for r, st := range submitAll(t, s, reqs) {
			res, err := st.Wait()
			if err != nil {
				t.Fatal(err)
			}
			if want := answers[r][len(reqs[r].Prompt):]; !slices.Equal(res.Tokens, want) {
				t.Fatalf("taps on the device %v, request %d: %v, autoregressive %v", onDevice, r, res.Tokens, want)
			}
		}
		waitIdle(t, s)
		received[i] = map[string][]float32{}
		for _, sess := range sessions {
			received[i][fmt.Sprint(sess.prompt)] = sess.received
		}
	}
	for _, r := range reqs {
		key := fmt.Sprint(r.Prompt)
		host, device := received[0][key], received[1][key]
		if len(host) == 0 || !slices.Equal(device, host) {
			t.Fatalf("prompt %v: the session got %d feature values with taps on the device, %d others brought home", r.Prompt, len(device), len(host))
		}
	}
}
