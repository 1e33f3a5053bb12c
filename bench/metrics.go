package bench

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"slices"
	"time"
)

// measured is one successful request of a run.
type measured struct {
	pass, conversation, turn int
	start                    time.Duration // since its pass started
	resp                     *Response
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ttft is the time to the first content chunk.
func (m *measured) ttft() time.Duration { return m.resp.Chunks[0].At }

// tpot is (e2e - ttft) / (output tokens - 1); ok is false for one token.
func (m *measured) tpot() (ms float64, ok bool) {
	n := m.resp.OutputTokens
	if n < 2 {
		return 0, false
	}
	return millis(m.resp.E2E-m.ttft()) / float64(n-1), true
}

// itls appends the gaps between chunks (itl_chunk_ms) and each gap divided
// by the tokens of the chunk that ended it (itl_token_ms). Without per-chunk
// counts the output's mean tokens per chunk stands in.
func (m *measured) itls(chunk, token []float64) ([]float64, []float64) {
	cs := m.resp.Chunks
	mean := float64(m.resp.OutputTokens) / float64(len(cs))
	for i := 1; i < len(cs); i++ {
		gap := millis(cs[i].At - cs[i-1].At)
		n := float64(cs[i].Tokens)
		if n == 0 {
			n = mean
		}
		chunk, token = append(chunk, gap), append(token, gap/n)
	}
	return chunk, token
}

// dist summarizes values as numpy does: population std, linear-interpolated percentiles.
func dist(values []float64) Dist {
	if len(values) == 0 {
		return Dist{}
	}
	s := slices.Clone(values)
	slices.Sort(s)
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	mean := sum / float64(len(s))
	ss := 0.0
	for _, v := range s {
		ss += (v - mean) * (v - mean)
	}
	return Dist{
		N: len(s), Mean: mean, Median: percentile(s, 50), Std: math.Sqrt(ss / float64(len(s))),
		P90: percentile(s, 90), P99: percentile(s, 99),
	}
}

// percentile of sorted values, interpolating linearly between ranks.
func percentile(sorted []float64, p float64) float64 {
	pos := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (pos-float64(lo))*(sorted[hi]-sorted[lo])
}

// latencies gathers the per-request latency distributions.
func latencies(reqs []measured) (ttft, tpot, itlChunk, itlToken, e2e Dist) {
	var ttfts, tpots, chunks, tokens, e2es []float64
	for i := range reqs {
		m := &reqs[i]
		ttfts = append(ttfts, millis(m.ttft()))
		e2es = append(e2es, millis(m.resp.E2E))
		if v, ok := m.tpot(); ok {
			tpots = append(tpots, v)
		}
		chunks, tokens = m.itls(chunks, tokens)
	}
	return dist(ttfts), dist(tpots), dist(chunks), dist(tokens), dist(e2es)
}

// delta is the counters' growth from before to after; nil without counters.
func delta(before, after *SpecCounter) *SpecCounter {
	if after == nil {
		return nil
	}
	d := *after
	d.AcceptedPerPosition = slices.Clone(after.AcceptedPerPosition)
	if before != nil {
		d.Drafts -= before.Drafts
		d.DraftTokens -= before.DraftTokens
		d.AcceptedTokens -= before.AcceptedTokens
		for i := range min(len(before.AcceptedPerPosition), len(d.AcceptedPerPosition)) {
			d.AcceptedPerPosition[i] -= before.AcceptedPerPosition[i]
		}
	}
	if after.Schedule != nil {
		s := *after.Schedule
		if before != nil && before.Schedule != nil {
			s.Probes -= before.Schedule.Probes
			s.Resumes -= before.Schedule.Resumes
			s.Stops -= before.Schedule.Stops
		}
		d.Schedule = &s
	}
	return &d
}

// acceptance derives τ, the acceptance rate and the per-position rates
// from spec-decode counters, as vLLM does: τ = 1 + accepted / drafts.
func acceptance(c *SpecCounter) (length, rate *float64, perPos []float64) {
	if c == nil || c.Drafts <= 0 {
		return nil, nil, nil
	}
	l := 1 + float64(c.AcceptedTokens)/float64(c.Drafts)
	length = &l
	if c.DraftTokens > 0 {
		r := float64(c.AcceptedTokens) / float64(c.DraftTokens)
		rate = &r
	}
	perPos = make([]float64, len(c.AcceptedPerPosition))
	for i, n := range c.AcceptedPerPosition {
		perPos[i] = float64(n) / float64(c.Drafts)
	}
	return length, rate, perPos
}

// pass is one measured pass over a run's requests.
type pass struct {
	wall      time.Duration
	reqs      []measured
	specAfter *SpecCounter
}

// computeMetrics summarizes a run's passes at its concurrency; before
// holds the spec-decode counters before the first pass (nil without
// speculation).
func computeMetrics(passes []pass, concurrency int, before *SpecCounter) (Metrics, []Sample) {
	var all []measured
	var wall, busy time.Duration
	tokens := 0
	samples := make([]Sample, len(passes))
	prev := before
	for i, p := range passes {
		n := 0
		for _, m := range p.reqs {
			n += m.resp.OutputTokens
			busy += m.resp.E2E
		}
		ttft, tpot, _, _, _ := latencies(p.reqs)
		tau, _, _ := acceptance(delta(prev, p.specAfter))
		samples[i] = Sample{OutputThroughput: float64(n) / p.wall.Seconds(), TPOTMs: tpot.Mean, TTFTMs: ttft.Mean, AcceptanceLength: tau}
		prev = p.specAfter
		all, wall, tokens = append(all, p.reqs...), wall+p.wall, tokens+n
	}
	var m Metrics
	m.TTFT, m.TPOT, m.ITLChunk, m.ITLToken, m.E2E = latencies(all)
	m.LaterTurnsTTFT, m.PrefixCacheHitRate = prefixReuse(all)
	m.OutputThroughput = float64(tokens) / wall.Seconds()
	if wall > 0 && concurrency > 0 {
		use := busy.Seconds() / (float64(concurrency) * wall.Seconds())
		m.SlotUse = &use
	}
	if m.TPOT.Mean > 0 {
		m.PerUserTokS = 1000 / m.TPOT.Mean
	}
	if len(passes) > 0 {
		m.SpecDecode = delta(before, passes[len(passes)-1].specAfter)
	}
	m.AcceptanceLength, m.AcceptanceRate, m.PerPositionAcceptance = acceptance(m.SpecDecode)
	return m, samples
}

// prefixReuse is the TTFT of requests after a conversation's first turn
// (those that resend earlier turns, which a prefix cache can reuse) and
// the share of prompt tokens the server reported cached (nil without
// prompt token counts).
func prefixReuse(reqs []measured) (laterTurns Dist, hitRate *float64) {
	var ttfts []float64
	prompt, cached := 0, 0
	for i := range reqs {
		m := &reqs[i]
		if m.turn > 0 {
			ttfts = append(ttfts, millis(m.ttft()))
		}
		prompt += m.resp.PromptTokens
		cached += m.resp.CachedTokens
	}
	if prompt > 0 {
		r := float64(cached) / float64(prompt)
		hitRate = &r
	}
	return dist(ttfts), hitRate
}

// speedup is the baseline's TPOT over the run's (same prompts, same binary);
// nil when either is unmeasured.
func speedup(baseline, run *Metrics) *float64 {
	if baseline.TPOT.N == 0 || run.TPOT.N == 0 || run.TPOT.Mean <= 0 {
		return nil
	}
	s := baseline.TPOT.Mean / run.TPOT.Mean
	return &s
}

// outputsHash fingerprints every request's output in order: token ids when
// the backend reports them, the text otherwise.
func outputsHash(reqs []measured) string {
	h := sha256.New()
	var buf [4]byte
	for _, m := range reqs {
		if m.resp.Tokens != nil {
			binary.LittleEndian.PutUint32(buf[:], uint32(len(m.resp.Tokens)))
			h.Write(buf[:])
			for _, t := range m.resp.Tokens {
				binary.LittleEndian.PutUint32(buf[:], uint32(t))
				h.Write(buf[:])
			}
			continue
		}
		binary.LittleEndian.PutUint32(buf[:], uint32(len(m.resp.Text)))
		h.Write(buf[:])
		h.Write([]byte(m.resp.Text))
	}
	return hex.EncodeToString(h.Sum(nil))
}
