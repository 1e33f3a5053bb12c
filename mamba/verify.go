package mamba

import (
	"fmt"
	"sync/atomic"

	"ddflash/kernels"
)

// Strategy is how GDN state is rolled back after a speculative verify that
// accepted only part of the proposal.
type Strategy int

const (
	// Replay keeps the committed state untouched during verify and saves each
	// verified token's recurrence inputs; commit re-runs the recurrence over
	// the accepted path only. Memory: inputs per token, no state copies.
	Replay Strategy = iota
	// Snapshot keeps the state after every verified token (SGLang's
	// intermediate state cache); commit copies the accepted token's state.
	// Memory: one full state per verified token and GDN layer.
	Snapshot
)

func (s Strategy) String() string {
	if s == Snapshot {
		return "snapshot"
	}
	return "replay"
}

// ParseStrategy reads "replay" or "snapshot".
func ParseStrategy(name string) (Strategy, error) {
	switch name {
	case "replay":
		return Replay, nil
	case "snapshot":
		return Snapshot, nil
	}
	return 0, fmt.Errorf("rollback strategy %q: want replay or snapshot", name)
}

// Verify is one sequence's GDN scratch for speculative verification of up to
// MaxTokens tokens (a chain, or a tree given by parent indices), with one part
// per tensor-parallel rank. The model forward fills it layer by layer;
// Commit then sets the sequence's state to the state after an accepted path.
type Verify struct {
	id        uint64 // unique in the process (ID)
	strategy  Strategy
	maxTokens int
	shards    []*verifyShard

	n       int
	parents []int32

	// Eager commits op by op, never recording (the engine sets it from
	// Model.Eager).
	Eager bool
	// chainCommit and treeCommit are its recorded commits
	// (commitRecorded) of a chain's verify and of a tree's.
	chainCommit, treeCommit kernels.Graph
}

// verifyShard is one rank's scratch, shaped like that rank's heads.
type verifyShard struct {
	Shard
	// Per GDN layer, rows of the current verify: conv inputs (both
	// strategies) and recurrence inputs (Replay only).
	mixed, q, k, v, g, beta []kernels.Buffer
	// Snapshot: per layer [maxTokens, state]. Replay: one buffer shared by all
	// layers, used only by trees (children read their parent's state). In the
	// recurrent state's dtype, as are finalState and the states they roll to.
	nodeStates []kernels.Buffer
	finalState kernels.Buffer // where a chain verify's final state goes (discarded)
	parentsBuf kernels.Buffer
	gathered   [5]kernels.Buffer // Replay along a tree path: q, k, v, g, beta rows
	pathBuf    kernels.Buffer    // Replay: the path's tokens, the rows to gather
	// commitArgs holds a recorded commit's last node, length, slot and
	// nodes.
	commitArgs kernels.Buffer
	bufs       []kernels.Buffer
}

// NewVerify allocates scratch for verifying up to maxTokens tokens of a
// sequence whose state lives in pool (one part on each of its shards).
func NewVerify(pool *Pool, strategy Strategy, maxTokens int) (*Verify, error) {
	v := &Verify{id: verifyIDs.Add(1), strategy: strategy, maxTokens: maxTokens}
	for r := range pool.Ranks() {
		sh, err := newVerifyShard(pool.Shard(r), strategy, maxTokens)
		if err != nil {
			v.Close()
			return nil, fmt.Errorf("mamba: rank %d verify scratch: %w", r, err)
		}
		v.shards = append(v.shards, sh)
	}
	return v, nil
}

func newVerifyShard(shard Shard, strategy Strategy, maxTokens int) (*verifyShard, error) {
	v := &verifyShard{Shard: shard}
	shape, gdn := shard.Shape, shard.Shape.GDN
	keyDim, valueDim := gdn.KeyHeads*gdn.KeyDim, gdn.ValueHeads*gdn.ValueDim
	widths := [5]int{keyDim, keyDim, valueDim, gdn.ValueHeads, gdn.ValueHeads}
	for l := 0; l < shape.Layers; l++ {
		if err := v.alloc(&v.mixed, kernels.F32, maxTokens*shape.ConvDim); err != nil {
			return nil, err
		}
		if strategy == Replay {
			for i, dst := range []*[]kernels.Buffer{&v.q, &v.k, &v.v, &v.g, &v.beta} {
				if err := v.alloc(dst, kernels.F32, maxTokens*widths[i]); err != nil {
					return nil, err
				}
			}
		}
		if strategy == Snapshot || l == 0 {
			if err := v.alloc(&v.nodeStates, shard.SSMDType, maxTokens*gdn.StateLen()); err != nil {
				return nil, err
			}
		}
	}
	var extra []kernels.Buffer
	if err := v.alloc(&extra, shard.SSMDType, gdn.StateLen()); err != nil {
		return nil, err
	}
	v.finalState = extra[0]
	if err := v.alloc(&extra, kernels.I32, maxTokens); err != nil {
		return nil, err
	}
	v.parentsBuf = extra[1]
	if strategy == Replay {
		for i := range v.gathered {
			if err := v.alloc(&extra, kernels.F32, maxTokens*widths[i]); err != nil {
				return nil, err
			}
			v.gathered[i] = extra[len(extra)-1]
		}
		if err := v.alloc(&extra, kernels.I32, maxTokens); err != nil {
			return nil, err
		}
		v.pathBuf = extra[len(extra)-1]
		if _, ok := shard.B.(kernels.Replayer); ok {
			if err := v.alloc(&extra, kernels.I32, commitNodes+maxTokens); err != nil {
				return nil, err
			}
			v.commitArgs = extra[len(extra)-1]
		}
	}
	return v, nil
}

func (v *verifyShard) alloc(dst *[]kernels.Buffer, dt kernels.DType, n int) error {
	buf, err := v.B.Alloc(dt, n)
	if err != nil {
		v.close()
		return err
	}
	*dst = append(*dst, buf)
	v.bufs = append(v.bufs, buf)
	return nil
}

func (v *verifyShard) close() {
	for _, buf := range v.bufs {
		v.B.Free(buf)
	}
	v.bufs = nil
}

// Close frees the scratch.
func (v *Verify) Close() {
	for _, g := range []*kernels.Graph{&v.chainCommit, &v.treeCommit} {
		if *g != nil {
			(*g).Close()
			*g = nil
		}
	}
	for _, sh := range v.shards {
		sh.close()
	}
	v.shards = nil
}

// verifyIDs numbers the Verify scratches made.
var verifyIDs atomic.Uint64

// ID tells this scratch from every other made in the process (its buffers
// from theirs, for a recorded step that writes them), never reused; 0 for
// a nil Verify.
func (v *Verify) ID() uint64 {
	if v == nil {
		return 0
	}
	return v.id
}

// MaxTokens is the longest proposal the scratch holds.
func (v *Verify) MaxTokens() int { return v.maxTokens }

// Strategy is how the scratch rolls a state back.
func (v *Verify) Strategy() Strategy { return v.strategy }

// Begin starts a verify of n tokens. parents gives each token's parent index
// (-1 for the root, which continues the committed state); nil means a chain.
func (v *Verify) Begin(n int, parents []int32) error {
	if n < 1 || n > v.maxTokens {
		return fmt.Errorf("mamba: verify of %d tokens, scratch holds 1..%d", n, v.maxTokens)
	}
	if parents != nil {
		if len(parents) != n {
			return fmt.Errorf("mamba: %d parents for %d tokens", len(parents), n)
		}
		for i, p := range parents {
			if p < -1 || int(p) >= i {
				return fmt.Errorf("mamba: token %d has parent %d; parents must precede their children", i, p)
			}
		}
		for _, sh := range v.shards {
			if err := sh.B.UploadI32(sh.parentsBuf, 0, parents); err != nil {
				return err
			}
		}
	}
	v.n, v.parents = n, parents
	return nil
}

// Parents is rank's device copy of the tree's parent indices, or nil for a
// chain (and for a nil Verify, so callers need not check).
func (v *Verify) Parents(rank int) kernels.Buffer {
	if v == nil || v.parents == nil {
		return nil
	}
	return v.shards[rank].parentsBuf
}

// Save records rank's share of GDN layer l's inputs for the current verify:
// conv inputs mixed [n, ConvDim] and, for Replay, the recurrence inputs.
func (v *Verify) Save(rank, l int, mixed, q, k, val, g, beta kernels.Buffer) {
	sh, n := v.shards[rank], v.n
	b := sh.B
	b.Copy(sh.mixed[l], mixed, 1, n*sh.Shape.ConvDim, 0, 0)
	if v.strategy != Replay {
		return
	}
	for _, pair := range [][2]kernels.Buffer{{sh.q[l], q}, {sh.k[l], k}, {sh.v[l], val}, {sh.g[l], g}, {sh.beta[l], beta}} {
		width := pair[0].Len() / v.maxTokens
		b.Copy(pair[0], pair[1], 1, n*width, 0, 0)
	}
}

// Targets returns where rank's layer-l verify recurrence writes: the final
// state of a chain (never the committed state) and per-token states when kept.
func (v *Verify) Targets(rank, l int) (stateOut, nodeStates kernels.Buffer) {
	sh := v.shards[rank]
	switch {
	case v.strategy == Snapshot:
		return sh.finalState, sh.nodeStates[l]
	case v.parents != nil:
		return nil, sh.nodeStates[0]
	default:
		return sh.finalState, nil
	}
}

// Commit sets the slot's conv and recurrent state, in every GDN layer and on
// every rank, to the state after the accepted path: path[0] is the root
// (token 0) and each following entry a child of the previous one.
func (v *Verify) Commit(pool *Pool, slot int, path []int32) error {
	if err := v.checkPath(path); err != nil {
		return err
	}
	if rp := v.recorder(); rp != nil {
		return v.commitRecorded(rp, pool, slot, path)
	}
	node := int(path[len(path)-1])
	gather := v.strategy == Replay && !isPrefix(path)
	for r, sh := range v.shards {
		b, shape := sh.B, sh.Shape
		stateLen := shape.GDN.StateLen()
		if gather {
			if err := b.UploadI32(sh.pathBuf, 0, path); err != nil {
				return err
			}
		}
		for l := 0; l < shape.Layers; l++ {
			b.ConvCommit(pool.Conv(r, l, slot), sh.mixed[l], v.Parents(r), node, shape.ConvDim, shape.ConvKernel)
			state := pool.SSM(r, l, slot)
			if v.strategy == Snapshot {
				b.Copy(state, b.Slice(sh.nodeStates[l], node*stateLen, stateLen), 1, stateLen, 0, 0)
				continue
			}
			ins := v.replayInputs(sh, l, len(path), gather)
			b.GDNRecurrence(nil, ins[0], ins[1], ins[2], ins[3], ins[4], state, state, nil, nil, len(path), shape.GDN)
		}
	}
	return nil
}

// recorder is the backend that records this scratch's commits, or nil: a
// Replayer on one rank, under Replay, unless Eager.
func (v *Verify) recorder() kernels.Replayer {
	if v.Eager || v.strategy != Replay || len(v.shards) != 1 || v.shards[0].commitArgs == nil {
		return nil
	}
	return v.shards[0].B.(kernels.Replayer)
}

// commitNodes is where a recorded commit's nodes start in commitArgs,
// after its last node, its length and its slot.
const commitNodes = 3

// commitRecorded commits path as Commit does, but with the kernels reading
// its last node, its length, the slot and its nodes from the shard's
// commitArgs (one upload), so that every path this scratch commits, into
// any slot, is one recording (one for chains, one for trees), made the
// first time and replayed from then on. A tree's path is gathered whole
// (MaxTokens rows, those past the path from node 0), a chain's is its
// prefix of rows. It reads the pool's states and this scratch's rows,
// which never move.
func (v *Verify) commitRecorded(rp kernels.Replayer, pool *Pool, slot int, path []int32) error {
	sh := v.shards[0]
	args := make([]int32, commitNodes+v.maxTokens)
	args[0], args[1], args[2] = path[len(path)-1], int32(len(path)), int32(slot)
	copy(args[commitNodes:], path)
	if err := rp.UploadI32(sh.commitArgs, 0, args); err != nil {
		return err
	}
	node, rows, slotAt := rp.Slice(sh.commitArgs, 0, 1), rp.Slice(sh.commitArgs, 1, 1), rp.Slice(sh.commitArgs, 2, 1)
	nodes := rp.Slice(sh.commitArgs, commitNodes, v.maxTokens)
	shape, tree := sh.Shape, v.parents != nil
	commit := func() error {
		for l := 0; l < shape.Layers; l++ {
			states := pool.SSMLayer(0, l)
			rp.ConvCommitAt(pool.ConvLayer(0, l), sh.mixed[l], v.Parents(0), node, slotAt, v.maxTokens-1, shape.ConvDim, shape.ConvKernel)
			ins := [5]kernels.Buffer{sh.q[l], sh.k[l], sh.v[l], sh.g[l], sh.beta[l]}
			if tree {
				for i, src := range ins {
					rp.Embedding(sh.gathered[i], src, nodes, v.maxTokens, src.Len()/v.maxTokens)
				}
				ins = sh.gathered
			}
			rp.GDNRecurrenceAt(ins[0], ins[1], ins[2], ins[3], ins[4], states, states, rows, slotAt, v.maxTokens, shape.GDN)
		}
		return nil
	}
	g := &v.chainCommit
	if tree {
		g = &v.treeCommit
	}
	if *g == nil {
		var err error
		if *g, err = rp.Capture(commit); err != nil {
			return fmt.Errorf("mamba: recording a commit: %w", err)
		}
	}
	return (*g).Replay()
}

// replayInputs returns a shard's layer-l recurrence inputs for the n
// tokens of the accepted path as contiguous rows: views of the saved rows
// when the path is a prefix 0..n-1, else gathered, one gather per input,
// by the path uploaded to sh.pathBuf.
func (v *Verify) replayInputs(sh *verifyShard, l, n int, gather bool) [5]kernels.Buffer {
	saved := [5]kernels.Buffer{sh.q[l], sh.k[l], sh.v[l], sh.g[l], sh.beta[l]}
	if !gather {
		return saved
	}
	for i, src := range saved {
		sh.B.Embedding(sh.gathered[i], src, sh.pathBuf, n, src.Len()/v.maxTokens)
	}
	return sh.gathered
}

// isPrefix reports whether path is the chain 0, 1, 2, ….
func isPrefix(path []int32) bool {
	for d, p := range path {
		if int(p) != d {
			return false
		}
	}
	return true
}

func (v *Verify) checkPath(path []int32) error {
	if len(path) == 0 || path[0] != 0 {
		return fmt.Errorf("mamba: accepted path %v must start at the root token 0", path)
	}
	for d := 1; d < len(path); d++ {
		p := int(path[d])
		if p >= v.n {
			return fmt.Errorf("mamba: accepted path %v leaves the %d verified tokens", path, v.n)
		}
		parent := int32(p - 1)
		if v.parents != nil {
			parent = v.parents[p]
		}
		if parent != path[d-1] {
			return fmt.Errorf("mamba: accepted path %v: token %d is not a child of %d", path, p, path[d-1])
		}
	}
	return nil
}
