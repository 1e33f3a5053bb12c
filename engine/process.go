package engine

import (
	"math"
	"slices"
)

// processors turn one position's raw logits into the logits a request
// samples from, in the order vLLM applies them:
//
//  1. the request's Constraint masks the tokens it forbids (vLLM applies
//     the structured-output bitmask before its sampler);
//  2. logit_bias is added;
//  3. min_tokens: while the output is shorter than MinTokens, the tokens
//     that would end it (EOS unless IgnoreEOS, and StopTokenIDs) are -Inf;
//  4. penalties: repetition over prompt and output (a positive logit is
//     divided by the penalty, a negative one multiplied), then frequency
//     (− penalty × count) and presence (− penalty once) over the output.
//
// The Sampler then takes the argmax (greedy) or applies temperature, min-p,
// top-k and top-p. Every step is a function of the output so far, so a
// speculative tree node is processed along its own path: the committed
// output followed by the drafted tokens from the root to that node.
type processors struct {
	r     *Request
	valid int
	// stops are the ids min_tokens holds back.
	stops []int32
	// prompt marks the prompt's distinct ids and promptIDs lists them (for
	// the repetition penalty).
	prompt    []bool
	promptIDs []int32
	counts    map[int32]int // output token counts, for the penalties
	row       []float32     // scratch: the processed row
	context   []int32       // scratch: output and path, for the constraint
}

func newProcessors(r *Request, eos []int32, valid int) *processors {
	p := &processors{r: r, valid: valid, counts: map[int32]int{}}
	p.stops = slices.Clone(r.StopTokenIDs)
	if !r.IgnoreEOS {
		p.stops = append(p.stops, eos...)
	}
	if p.repetition() {
		p.prompt = make([]bool, valid)
		for _, t := range r.Prompt {
			if !p.prompt[t] {
				p.prompt[t] = true
				p.promptIDs = append(p.promptIDs, t)
			}
		}
	}
	return p
}

func (p *processors) repetition() bool {
	rp := p.r.Sampling.RepetitionPenalty
	return rp != 0 && rp != 1
}

func (p *processors) penalised() bool {
	s := p.r.Sampling
	return p.repetition() || s.PresencePenalty != 0 || s.FrequencyPenalty != 0
}

// active reports whether a position after n output tokens needs processing.
func (p *processors) active(n int) bool {
	return p.r.Constraint != nil || len(p.r.Sampling.LogitBias) > 0 ||
		(n < p.r.MinTokens && len(p.stops) > 0) || p.penalised()
}

// emitted records an output token.
func (p *processors) emitted(tok int32) {
	if p.penalised() {
		p.counts[tok]++
	}
}

// apply returns the processed logits (the valid vocabulary) for the position
// after output followed by path, or raw itself when nothing applies. The
// result is scratch, valid until the next call.
func (p *processors) apply(raw []float32, output, path []int32) []float32 {
	n := len(output) + len(path)
	if !p.active(n) {
		return raw
	}
	row := append(p.row[:0], raw[:p.valid]...)
	p.row = row
	if c := p.r.Constraint; c != nil {
		p.context = append(append(p.context[:0], output...), path...)
		c.Mask(p.context, row)
	}
	for id, b := range p.r.Sampling.LogitBias {
		row[id] += b
	}
	if n < p.r.MinTokens {
		for _, id := range p.stops {
			row[id] = float32(math.Inf(-1))
		}
	}
	if p.penalised() {
		for _, t := range path {
			p.counts[t]++
		}
		p.penalise(row)
		for _, t := range path {
			if p.counts[t]--; p.counts[t] == 0 {
				delete(p.counts, t)
			}
		}
	}
	return row
}

// penalise applies the repetition, frequency and presence penalties.
func (p *processors) penalise(row []float32) {
	s := p.r.Sampling
	if p.repetition() {
		rp := float32(s.RepetitionPenalty)
		repeat := func(id int32) {
			if row[id] > 0 {
				row[id] /= rp
			} else {
				row[id] *= rp
			}
		}
		for _, id := range p.promptIDs {
			repeat(id)
		}
		for id := range p.counts {
			if !p.prompt[id] {
				repeat(id)
			}
		}
	}
	for id, n := range p.counts {
		row[id] -= float32(s.FrequencyPenalty) * float32(n)
		row[id] -= float32(s.PresencePenalty)
	}
}
