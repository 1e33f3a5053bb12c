package mamba

// Memory cost of Gated DeltaNet state, per request, for each way of rolling a
// state back after a speculative verify. The planner sizes its pools with
// these; element sizes are passed in bytes so it can try other dtypes than the
// ones a backend happens to use.

// f32Bytes is the size of the values replay keeps: gates and projections must
// stay fp32 for the recurrence to be reproduced exactly.
const f32Bytes = 4

// SlotBytes is one request's state: for every GDN layer the conv window of
// (K-1)·ConvDim elements and the recurrent state of ValueHeads·KeyDim·ValueDim.
// Qwen3.6-27B with an fp32 ssm and a bf16 conv: 153,944,064 B (146.81 MiB).
func SlotBytes(s Shape, ssmBytes, convBytes int) int64 {
	perLayer := int64(s.ConvLen())*int64(convBytes) + int64(s.GDN.StateLen())*int64(ssmBytes)
	return int64(s.Layers) * perLayer
}

// SnapshotBytes is the rollback memory of one request when the verify pass
// writes a full state after every draft token, as SGLang's
// intermediate_ssm_state_cache and intermediate_conv_window_cache do:
// draftTokens copies of the slot. Qwen3.6-27B at 16 draft tokens: 2.29 GiB.
func SnapshotBytes(s Shape, ssmBytes, convBytes, draftTokens int) int64 {
	return int64(draftTokens) * SlotBytes(s, ssmBytes, convBytes)
}

// ReplayBytes is the rollback memory of one request when the verify pass keeps
// the committed state untouched and saves, per draft token and GDN layer, the
// inputs of the recurrence (post-conv q, k, v and the gates g, β, all fp32) and
// the raw conv input (convBytes per channel); commit replays the accepted
// tokens from the committed state. Qwen3.6-27B: 1.89 MiB + 0.94 MiB per token.
//
// The verify forward also needs working states for one layer at a time: one
// for a chain, one per node for a tree (children continue their parent's
// state). They are stored like the recurrent state (ssmBytes per element)
// and reused across layers.
func ReplayBytes(s Shape, ssmBytes, convBytes, draftTokens int, tree bool) int64 {
	g := s.GDN
	recurrenceInputs := 2*g.KeyHeads*g.KeyDim + g.ValueHeads*g.ValueDim + 2*g.ValueHeads
	perToken := int64(s.Layers) * (int64(recurrenceInputs)*f32Bytes + int64(s.ConvDim)*int64(convBytes))
	workingStates := int64(1)
	if tree {
		workingStates = int64(draftTokens)
	}
	return int64(draftTokens)*perToken + workingStates*int64(g.StateLen())*int64(ssmBytes)
}

// RollbackBytes is one request's rollback memory under the strategy for
// draftTokens verified tokens (a tree when tree is set); nothing without
// speculation.
func (s Strategy) RollbackBytes(shape Shape, ssmBytes, convBytes, draftTokens int, tree bool) int64 {
	switch {
	case draftTokens == 0:
		return 0
	case s == Snapshot:
		return SnapshotBytes(shape, ssmBytes, convBytes, draftTokens)
	default:
		return ReplayBytes(shape, ssmBytes, convBytes, draftTokens, tree)
	}
}

// MarshalText writes the strategy by name, as plans show it in JSON.
func (s Strategy) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
