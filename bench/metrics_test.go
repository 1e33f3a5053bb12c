package bench

import (
	"math"
	"slices"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }

func TestDistMatchesNumpy(t *testing.T) {
	// numpy: mean 2.5, median 2.5, std (ddof=0) sqrt(1.25), percentile 90 -> 3.7, 99 -> 3.97
	d := dist([]float64{4, 1, 3, 2})
	want := Dist{N: 4, Mean: 2.5, Median: 2.5, Std: math.Sqrt(1.25), P90: 3.7, P99: 3.97}
	if d.N != want.N || !near(d.Mean, want.Mean) || !near(d.Median, want.Median) || !near(d.Std, want.Std) || !near(d.P90, want.P90) || !near(d.P99, want.P99) {
		t.Errorf("dist = %+v, want %+v", d, want)
	}
	if one := dist([]float64{7}); one.Median != 7 || one.P99 != 7 || one.Std != 0 {
		t.Errorf("dist of one value = %+v", one)
	}
	if empty := dist(nil); empty != (Dist{}) {
		t.Errorf("dist of nothing = %+v", empty)
	}
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// TestMetricsFollowTheAnchorDefinitions checks every metric against a
// hand-computed request: chunks of 1, 3 and 2 tokens.
func TestMetricsFollowTheAnchorDefinitions(t *testing.T) {
	req := measured{resp: &Response{
		Chunks:       []Chunk{{At: ms(10), Tokens: 1}, {At: ms(14), Tokens: 3}, {At: ms(20), Tokens: 2}},
		E2E:          ms(20),
		OutputTokens: 6,
	}}
	before := &SpecCounter{Drafts: 10, DraftTokens: 40, AcceptedTokens: 5, AcceptedPerPosition: []int64{3, 2},
		Schedule: &ScheduleCounter{Probes: 2, Resumes: 1, Stops: 3, Relapses: 4}}
	after := &SpecCounter{Drafts: 14, DraftTokens: 56, AcceptedTokens: 11, AcceptedPerPosition: []int64{6, 4, 1},
		Schedule: &ScheduleCounter{Probes: 7, Resumes: 1, Stops: 4, Relapses: 2}}
	m, samples := computeMetrics([]pass{{wall: ms(40), reqs: []measured{req}, specAfter: after}}, 1, before)

	checks := []struct {
		name      string
		got, want float64
	}{
		{"output_throughput", m.OutputThroughput, 6 / 0.040},
		{"ttft_ms", m.TTFT.Mean, 10},
		{"tpot_ms", m.TPOT.Mean, (20.0 - 10) / 5},
		{"per_user_tok_s", m.PerUserTokS, 1000 / 2.0},
		{"itl_chunk_ms", m.ITLChunk.Mean, (4 + 6) / 2.0},
		{"itl_token_ms", m.ITLToken.Mean, (4.0/3 + 6.0/2) / 2},
		{"e2el_ms", m.E2E.Mean, 20},
		{"slot_use", *m.SlotUse, 20.0 / 40},
		{"acceptance_length", *m.AcceptanceLength, 1 + 6.0/4},
		{"acceptance_rate", *m.AcceptanceRate, 6.0 / 16},
		{"sample output_throughput", samples[0].OutputThroughput, 150},
		{"sample acceptance_length", *samples[0].AcceptanceLength, 2.5},
	}
	for _, c := range checks {
		if !near(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if want := []float64{0.75, 0.5, 0.25}; !slices.Equal(m.PerPositionAcceptance, want) {
		t.Errorf("per_position_acceptance = %v, want %v", m.PerPositionAcceptance, want)
	}
	if m.SpecDecode.Drafts != 4 || m.SpecDecode.DraftTokens != 16 || !slices.Equal(m.SpecDecode.AcceptedPerPosition, []int64{3, 2, 1}) {
		t.Errorf("counter delta = %+v", m.SpecDecode)
	}
	// The schedule's counts are the run's; its relapses are where it ended.
	if want := (ScheduleCounter{Probes: 5, Resumes: 0, Stops: 1, Relapses: 2}); m.SpecDecode.Schedule == nil || *m.SpecDecode.Schedule != want {
		t.Errorf("schedule delta = %+v, want %+v", m.SpecDecode.Schedule, want)
	}
	if m.ITLChunk.N != 2 || m.TPOT.N != 1 {
		t.Errorf("sample counts: itl %d, tpot %d", m.ITLChunk.N, m.TPOT.N)
	}
}

func TestMetricsWithoutSpeculationOrTokenCounts(t *testing.T) {
	// A server that streams no token ids: 8 tokens in 4 chunks, 2 per chunk on average.
	req := measured{resp: &Response{
		Chunks:       []Chunk{{At: ms(5)}, {At: ms(9)}, {At: ms(13)}, {At: ms(17)}},
		E2E:          ms(17),
		OutputTokens: 8,
	}}
	m, _ := computeMetrics([]pass{{wall: ms(20), reqs: []measured{req}}}, 1, nil)
	if !near(m.ITLToken.Mean, 2) || !near(m.ITLChunk.Mean, 4) {
		t.Errorf("itl_token_ms %v, itl_chunk_ms %v: want 2 and 4", m.ITLToken.Mean, m.ITLChunk.Mean)
	}
	if m.AcceptanceLength != nil || m.AcceptanceRate != nil || m.PerPositionAcceptance != nil || m.SpecDecode != nil {
		t.Errorf("acceptance without counters: %+v", m)
	}
}

// TestSlotUseShowsAPassTail: at concurrency 2, two passes of 40 ms: in the
// first both requests run the whole pass, in the second one ends at 20 ms
// and its slot idles for the rest (the pass's tail): 140 busy ms of 160.
func TestSlotUseShowsAPassTail(t *testing.T) {
	req := func(e2e float64) measured {
		return measured{resp: &Response{Chunks: []Chunk{{At: ms(5), Tokens: 1}}, E2E: ms(e2e), OutputTokens: 1}}
	}
	passes := []pass{
		{wall: ms(40), reqs: []measured{req(40), req(40)}},
		{wall: ms(40), reqs: []measured{req(40), req(20)}},
	}
	m, _ := computeMetrics(passes, 2, nil)
	if m.SlotUse == nil || !near(*m.SlotUse, 140.0/160) {
		t.Errorf("slot_use = %v, want %v", m.SlotUse, 140.0/160)
	}
}

func TestSpeedupIsBaselineTPOTOverRunTPOT(t *testing.T) {
	base := Metrics{TPOT: Dist{N: 3, Mean: 30}}
	run := Metrics{TPOT: Dist{N: 3, Mean: 12}}
	if s := speedup(&base, &run); s == nil || !near(*s, 2.5) {
		t.Errorf("speedup = %v, want 2.5", s)
	}
	if s := speedup(&base, &Metrics{}); s != nil {
		t.Errorf("speedup without a measured TPOT = %v, want none", *s)
	}
}

func TestOutputsHashSeparatesRequests(t *testing.T) {
	a := []measured{{resp: &Response{Tokens: []int32{1, 2}}}, {resp: &Response{Tokens: []int32{3}}}}
	b := []measured{{resp: &Response{Tokens: []int32{1}}}, {resp: &Response{Tokens: []int32{2, 3}}}}
	if outputsHash(a) == outputsHash(b) {
		t.Error("different splits of the same tokens hash alike")
	}
	if outputsHash(a) != outputsHash(slices.Clone(a)) {
		t.Error("the hash is not a function of the outputs")
	}
}
