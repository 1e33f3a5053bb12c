package engine

// Test helpers that drive one sequence directly through Model.Forward.

// prefill feeds tokens in the engine's prefill chunks and returns the last
// position's logits and the tapped features of every token.
func (e *Engine) prefill(s *sequence, tokens []int32, taps []int) ([]float32, []float32, error) {
	var logits, features []float32
	for start := 0; start < len(tokens); start += e.opts.PrefillChunk {
		chunk := tokens[start:min(start+e.opts.PrefillChunk, len(tokens))]
		rows := NoRows
		if start+len(chunk) == len(tokens) {
			rows = LastRow
		}
		out, err := e.forward(s, SeqInput{Tokens: chunk, Logits: rows}, taps)
		if err != nil {
			return nil, nil, err
		}
		logits = out.Logits
		features = append(features, out.Features...)
	}
	return logits, features, nil
}

// step feeds one token and returns the next logits.
func (e *Engine) step(s *sequence, tok int32) ([]float32, error) {
	out, err := e.forward(s, SeqInput{Tokens: []int32{tok}, Logits: LastRow}, nil)
	if err != nil {
		return nil, err
	}
	return out.Logits, nil
}

// forward runs in's tokens after the sequence's cached ones and, unless
// they are a speculative verify, counts them as committed.
func (e *Engine) forward(s *sequence, in SeqInput, taps []int) (*SeqOutput, error) {
	if err := e.Model.KV.Reserve(&s.kv, s.len+len(in.Tokens)); err != nil {
		return nil, err
	}
	in.Start, in.KV, in.Slot = s.len, &s.kv, s.slot
	out, err := e.Model.Forward([]SeqInput{in}, taps)
	if err != nil {
		return nil, err
	}
	if in.Spec == nil {
		s.len += len(in.Tokens)
	}
	return &out[0], nil
}
