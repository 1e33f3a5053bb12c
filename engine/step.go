package engine

import (
	"fmt"
	"math/bits"
	"strings"

	"ddflash/kernels"
)

// Recorded steps. On a backend that records ops (kernels.Replayer: CUDA
// graphs), a decode or verify step runs op by op the first time its shape
// is seen, is recorded the second time, and from then on is one replay:
// one launch instead of one per op. A recording reads everything that
// changes from step to step from device memory: the step's metadata
// (uploadMeta, one upload) and the inputs the layers compute from it, in
// buffers that stay where they are (activations, LM head, taps, top-k).
// Whatever would move them (a step with more rows than before, a longer
// page table than the metadata buffer holds) drops the recordings first.

// maxStepGraphs bounds the recordings kept: past it they are all dropped
// (a server whose batches keep changing shape records them again).
const maxStepGraphs = 64

// stepGraphs holds a model's recorded steps by shape (stepShape).
type stepGraphs struct {
	seen   map[string]bool // shapes run once, op by op
	graphs map[string]kernels.Graph
	// kvMoves is CommitKV's recording, made the second time it runs:
	// every attention layer's moves of as many slot pairs as rank 0's moves
	// buffer holds.
	kvMoves     kernels.Graph
	kvMovesSeen bool
}

// runStep runs step (which issues a Forward's ops) op by op, records it,
// or replays its recording, as described above.
func (m *Model) runStep(seqs []SeqInput, taps []int, step func() error) error {
	if !m.records() || !replayable(seqs) {
		return step()
	}
	rp := m.ranks[0].b.(kernels.Replayer)
	key := m.stepShape(seqs, taps)
	st := &m.steps
	if g := st.graphs[key]; g != nil {
		return g.Replay()
	}
	if !st.seen[key] {
		if st.seen == nil {
			st.seen = map[string]bool{}
		}
		st.seen[key] = true
		return step() // sizes the backend's scratch memory for the recording
	}
	if len(st.graphs) >= maxStepGraphs {
		m.dropGraphs()
	}
	g, err := rp.Capture(step)
	if err != nil {
		return fmt.Errorf("engine: recording a step: %w", err)
	}
	if st.graphs == nil {
		st.graphs = map[string]kernels.Graph{}
	}
	st.graphs[key] = g
	return g.Replay()
}

// maxDecodeBucket is the largest decode step padDecode pads.
const maxDecodeBucket = 64

// padDecode pads a decode step of n sequences, on a backend that records
// steps, to the next power of two (up to maxDecodeBucket) with copies of
// its last sequence, so that one recording serves every batch of 2^k-1 ..
// 2^k sequences instead of one recording per count (vLLM's capture sizes
// do the same). A copy decodes token 0 at position 0 in a state slot and a
// KV page that no request holds (borrowed for the step: whatever it writes
// there is never read, a request taking them zeroes or overwrites them),
// its rows apart from the real ones' (every op is row-wise or per
// sequence); the caller drops its outputs. Without a spare slot and page,
// for steps that bring whole logit rows home, or for any other step, seqs
// come back as they were.
func (m *Model) padDecode(seqs []SeqInput) []SeqInput {
	n := len(seqs)
	if !m.records() || n == 0 || n&(n-1) == 0 || n > maxDecodeBucket {
		return seqs
	}
	for _, sq := range seqs {
		// Whole logit rows come home: a copy's would too (a vocabulary's
		// worth of bytes each), so such steps stay as they are.
		wholeRows := sq.Logits != NoRows && sq.Top == 0
		if len(sq.Tokens) != 1 || sq.Spec != nil || wholeRows {
			return seqs
		}
	}
	slot, okSlot := m.States.Spare()
	page, okPage := m.KV.Spare()
	if !okSlot || !okPage {
		return seqs
	}
	m.padKV.Pages = append(m.padKV.Pages[:0], page)
	pad := seqs[n-1]
	pad.Tokens, pad.Start, pad.KV, pad.Slot = padToken[:], 0, &m.padKV, slot
	padded := make([]SeqInput, n, 1<<bits.Len(uint(n)))
	copy(padded, seqs)
	for len(padded) < cap(padded) {
		padded = append(padded, pad)
	}
	return padded
}

// padToken is what a padding sequence decodes.
var padToken = [1]int32{0}

// records reports whether the model records its steps: on a backend that
// can (kernels.Replayer), on one rank, unless Eager.
func (m *Model) records() bool {
	_, ok := m.ranks[0].b.(kernels.Replayer)
	return ok && !m.Eager && len(m.ranks) == 1
}

// verifyBucket is how many of a tree's drafted nodes a verify of nodes of
// them takes where steps are recorded: its rows (the nodes and the root)
// rounded up to a power of two, at most the whole tree's. An adaptive
// policy cuts drafts to any node count, and each count of each sequence
// of a step would be a step shape of its own, recorded apart; in buckets
// they are a few. The nodes added are drafted ones, verified as any (the
// output stays the target's), and on a GPU a verify of a few rows more
// costs next to nothing: its step streams the weights once either way.
func verifyBucket(nodes, drafted int) int {
	if nodes <= 0 {
		return nodes
	}
	return min(1<<bits.Len(uint(nodes)), drafted+1) - 1
}

// replayable reports whether a step can be recorded: a decode or verify
// step. A prefill chunk's GDN ops depend on where its tokens fall between
// chunk boundaries (gdnChain), which the shape does not say.
func replayable(seqs []SeqInput) bool {
	for _, sq := range seqs {
		if sq.Spec == nil && len(sq.Tokens) > 1 {
			return false
		}
	}
	return true
}

// stepShape names what a recording of a step depends on: per sequence its
// token count, logit rows, top-k, verify scratch and whether it is a tree;
// the taps; and the attention's key bound. Positions, KV slots, page
// tables, masks and state slots are data the step uploads (deltaNet reads
// the slots from the step's metadata), so a verify scratch given to the
// step's k-th verifying sequence whatever its slot (Engine.assignVerifies)
// makes the recording serve any slots.
func (m *Model) stepShape(seqs []SeqInput, taps []int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "keys %d taps %v", m.ranks[0].meta.maxKeys, taps)
	for _, sq := range seqs {
		fmt.Fprintf(&b, "|%d logits %d top %d verify %d tree %t", len(sq.Tokens), sq.Logits, sq.Top, sq.Spec.ID(), sq.Parents != nil)
	}
	return b.String()
}

// dropGraphs closes every recording, before a buffer one may use moves.
func (m *Model) dropGraphs() {
	for _, g := range m.steps.graphs {
		g.Close()
	}
	m.dropKVMoves()
	m.steps = stepGraphs{}
	m.moves++
}

// dropKVMoves closes CommitKV's recording, before its buffer moves.
func (m *Model) dropKVMoves() {
	if m.steps.kvMoves != nil {
		m.steps.kvMoves.Close()
	}
	m.steps.kvMoves, m.steps.kvMovesSeen = nil, false
}

// Moves counts the times the model's step buffers moved (its recordings
// were dropped): a recording made elsewhere that reads them, as a
// drafter's through ProjectVocab, is stale once the count changes.
func (m *Model) Moves() int { return m.moves }

// Ranks is the model's tensor-parallel degree.
func (m *Model) Ranks() int { return len(m.ranks) }

// deviceTops is where a Replayer's step puts its top-k: each sequence i
// that asks for Top gets its logit rows' TopKLSE records ([rows, 2·Top+1])
// from element at[i] of buf (a view of Model.out); used elements in all.
type deviceTops struct {
	buf  kernels.Buffer
	at   []int
	used int
}

// layoutTops lays out m.tops for a step (but its buffer), or returns nil
// when the backend is no Replayer or no sequence asks for a top-k.
func (m *Model) layoutTops(seqs []SeqInput, logitRows int) *deviceTops {
	if _, ok := m.ranks[0].b.(kernels.Replayer); !ok || logitRows == 0 {
		return nil
	}
	t := &m.tops
	t.at, t.used = t.at[:0], 0
	for _, sq := range seqs {
		t.at = append(t.at, t.used)
		if sq.Top > 0 {
			t.used += sq.Logits.count(len(sq.Tokens)) * (2*sq.Top + 1)
		}
	}
	if t.used == 0 {
		return nil
	}
	return t
}

// reduceTops queues each sequence's top-k over the real token ids of its
// logit rows into t.
func (m *Model) reduceTops(seqs []SeqInput, logits kernels.Buffer, t *deviceTops) {
	b := m.ranks[0].b.(kernels.Replayer)
	V, n := m.Cfg.VocabSize, 0
	for i, sq := range seqs {
		want := sq.Logits.count(len(sq.Tokens))
		if sq.Top > 0 && want > 0 {
			b.TopKLSE(b.Slice(t.buf, t.at[i], want*(2*sq.Top+1)), b.Slice(logits, n*V, want*V), want, m.validVocab(), V, sq.Top)
		}
		n += want
	}
}

// unpackTop splits rows TopKLSE records of k into ids and logits, row by row.
func unpackTop(rec []float32, rows, k int) ([]int32, []float32) {
	ids, vals := make([]int32, rows*k), make([]float32, rows*k)
	for r := range rows {
		o := rec[r*(2*k+1):]
		for j := range k {
			vals[r*k+j], ids[r*k+j] = o[j], int32(o[k+j])
		}
	}
	return ids, vals
}
