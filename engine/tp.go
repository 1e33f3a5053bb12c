package engine

import (
	"errors"
	"fmt"
	"sync"

	"ddflash/engine/config"
	"ddflash/kernels"
)

// Tensor parallelism: the model is split over ranks, each with its own
// backend, its share of the weights and its share of the caches.
//
//   - Attention: query heads split evenly; KV heads split evenly, or, when
//     there are fewer KV heads than ranks, each rank holds (a replica of) the
//     one KV head its query heads read. q/k/v projections are split by rows
//     (column-parallel), o_proj by columns (row-parallel), then all-reduced.
//   - Gated DeltaNet: key and value heads split evenly, with their conv
//     channels, gates and recurrent states; out_proj is row-parallel.
//   - MLP: gate/up split by rows, down by columns, then all-reduced.
//   - The LM head is vocabulary-parallel: each rank scores its slice of the
//     vocabulary and the slices are gathered, so rank 0 samples (or takes the
//     argmax) over the whole vocabulary. The embedding, the norms and the
//     residual stream are replicated; all-reduce sums in rank order, so every
//     rank holds bit-identical activations.
//   - The DFlash drafter runs on rank 0 (it is small) and scores its
//     proposals through the target's vocabulary-parallel LM head.

// Comm moves activations between tensor-parallel ranks (kernels.Comm).
type Comm = kernels.Comm

// connect links tensor-parallel ranks (nil for one rank): backends that bring
// their own communicator (kernels.Connector: NCCL between GPUs) must use it,
// since host copies would stall every collective; others meet in a LocalComm.
func connect(backends []kernels.Backend) (Comm, error) {
	if len(backends) < 2 {
		return nil, nil
	}
	if c, ok := backends[0].(kernels.Connector); ok {
		comm, err := c.Connect(backends)
		if err != nil {
			return nil, fmt.Errorf("tensor parallelism over %d ranks: %w", len(backends), err)
		}
		return comm, nil
	}
	return NewLocalComm(backends), nil
}

// LocalComm is the in-process communicator for ranks that are goroutines of
// one process (CPU ranks, or GPUs without NCCL): data passes through host
// memory, and a barrier separates each collective's writes from its reads.
// Each call completes the collective before it returns.
type LocalComm struct {
	backends []kernels.Backend

	mu      sync.Mutex
	cond    *sync.Cond
	waiting int
	phase   uint64
	staged  [][]float32 // per rank: what it contributes to the collective in flight
	result  [][]float32 // per rank: its reduction output
}

// NewLocalComm connects ranks whose buffers live on the given backends.
func NewLocalComm(backends []kernels.Backend) *LocalComm {
	c := &LocalComm{backends: backends, staged: make([][]float32, len(backends)), result: make([][]float32, len(backends))}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// Size is the number of ranks.
func (c *LocalComm) Size() int { return len(c.backends) }

// barrier returns when every rank has reached it.
func (c *LocalComm) barrier() {
	c.mu.Lock()
	defer c.mu.Unlock()
	phase := c.phase
	c.waiting++
	if c.waiting == len(c.backends) {
		c.waiting = 0
		c.phase++
		c.cond.Broadcast()
		return
	}
	for phase == c.phase {
		c.cond.Wait()
	}
}

// stage copies rank's buf[:n] to its host staging area.
func (c *LocalComm) stage(rank int, buf kernels.Buffer, n int) error {
	if cap(c.staged[rank]) < n {
		c.staged[rank] = make([]float32, n)
	}
	c.staged[rank] = c.staged[rank][:n]
	return c.backends[rank].DownloadF32(buf, 0, c.staged[rank])
}

// AllReduceSum implements Comm.
func (c *LocalComm) AllReduceSum(rank int, buf kernels.Buffer, n int) error {
	err := c.stage(rank, buf, n)
	c.barrier()
	if cap(c.result[rank]) < n {
		c.result[rank] = make([]float32, n)
	}
	sum := c.result[rank][:n]
	copy(sum, c.staged[0][:n])
	for r := 1; r < len(c.staged); r++ {
		for i, v := range c.staged[r][:n] {
			sum[i] += v
		}
	}
	c.barrier() // every rank has read the staged values before any restages
	return errors.Join(err, c.backends[rank].UploadF32(buf, 0, sum))
}

// AllGather implements Comm.
func (c *LocalComm) AllGather(rank int, dst, src kernels.Buffer, n int) error {
	err := c.stage(rank, src, n)
	c.barrier()
	for r, part := range c.staged {
		err = errors.Join(err, c.backends[rank].UploadF32(dst, r*n, part[:n]))
	}
	c.barrier()
	return err
}

// Broadcast implements Comm.
func (c *LocalComm) Broadcast(rank, root int, buf kernels.Buffer, n int) error {
	var err error
	if rank == root {
		err = c.stage(rank, buf, n)
	}
	c.barrier()
	if rank != root {
		err = c.backends[rank].UploadF32(buf, 0, c.staged[root][:n])
	}
	c.barrier()
	return err
}

// shard is rank r of a tp-way split.
type shard struct{ rank, tp int }

// even is this rank's share of n units of width elements (rows of a weight,
// channels of a state), split evenly.
func (s shard) even(n, width int) Span {
	per := n / s.tp
	return Span{s.rank * per * width, (s.rank + 1) * per * width}
}

// kvHeads is the span of KV heads this rank holds, in units of width: an
// even share, or the single head its query heads read when heads < tp.
func (s shard) kvHeads(n, width int) Span {
	if n >= s.tp {
		return s.even(n, width)
	}
	h := s.rank / (s.tp / n)
	return Span{h * width, (h + 1) * width}
}

// splitConfig is the per-rank geometry of a tp-way split of cfg: the same
// model with each rank's share of the heads and MLP width. It fails, naming
// every dimension, when tp does not divide the model evenly.
func splitConfig(cfg *config.Config, tp int) (*config.Config, error) {
	if tp < 1 {
		return nil, fmt.Errorf("tensor parallelism %d: want at least 1", tp)
	}
	var errs []error
	exact := func(what string, n int) int {
		if n%tp != 0 {
			errs = append(errs, fmt.Errorf("--tp %d does not divide the %d %s", tp, n, what))
		}
		return n / tp
	}
	rc := *cfg
	rc.NumHeads = exact("attention heads", cfg.NumHeads)
	if n := cfg.NumKVHeads; (n >= tp && n%tp != 0) || (n < tp && tp%n != 0) {
		errs = append(errs, fmt.Errorf("--tp %d and the %d KV heads cannot be split evenly (nor replicated)", tp, n))
	}
	rc.NumKVHeads = max(1, cfg.NumKVHeads/tp)
	rc.LinearKeyHeads = exact("GDN key heads", cfg.LinearKeyHeads)
	rc.LinearValueHeads = exact("GDN value heads", cfg.LinearValueHeads)
	rc.IntermediateSize = exact("MLP intermediate size", cfg.IntermediateSize)
	exact("vocabulary rows", cfg.VocabSize)
	return &rc, errors.Join(errs...)
}
