package kvevents

import (
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"ddflash/engine"
)

// The fields every block event carries as vLLM's do for a model's
// full-attention KV cache group.
const (
	medium    = "GPU"
	groupIdx  = 0
	groupKind = "full_attention"
)

// dataParallelRank is the payload's rank: a replica is one engine, and
// data-parallel replicas are separate serve processes (docs/scale-out.md).
const dataParallelRank = 0

// encodeBatch is a message's payload: [timestamp, [events...], rank],
// each event the positional array vLLM's msgspec writes. Hashes are
// written as 64-bit unsigned integers, which every router decodes.
func encodeBatch(batch []event) ([]byte, error) {
	events := make([]any, len(batch))
	for i, ev := range batch {
		events[i] = encodeEvent(ev)
	}
	now := float64(time.Now().UnixNano()) / 1e9
	return msgpack.Marshal([]any{now, events, dataParallelRank})
}

func encodeEvent(ev event) []any {
	switch {
	case ev.cleared:
		return []any{"AllBlocksCleared"}
	case ev.Kind == engine.BlocksStored:
		var parent any // nil: the blocks start a prompt
		if ev.Parent != 0 {
			parent = ev.Parent
		}
		return []any{"BlockStored", ev.Blocks, parent, ev.Tokens, ev.BlockSize,
			nil, medium, nil, nil, groupIdx, groupKind, nil}
	default:
		return []any{"BlockRemoved", ev.Blocks, medium, groupIdx}
	}
}
