package kernels

// Comm moves activations between tensor-parallel ranks. Every rank calls each
// collective once, in the same order, with buffers on its own backend. A call
// returns once the collective's result is ordered before the rank's later ops
// and downloads: an in-process communicator completes it before returning, a
// GPU one (NCCL) enqueues it on the rank's stream. An implementation that can
// fail must fail every rank of a collective, so no rank waits for a peer that
// gave up.
type Comm interface {
	Size() int
	// AllReduceSum replaces buf[:n] on every rank by the element-wise sum
	// over ranks, added in rank order.
	AllReduceSum(rank int, buf Buffer, n int) error
	// AllGather writes each rank r's src[:n] to dst[r*n:(r+1)*n] on every rank.
	AllGather(rank int, dst, src Buffer, n int) error
	// Broadcast copies root's buf[:n] to buf on every rank.
	Broadcast(rank, root int, buf Buffer, n int) error
}

// Connector is a Backend whose tensor-parallel ranks need a communicator of
// their own kind (GPUs: NCCL) rather than copies through host memory.
// Connect links ranks (this backend among them, all of the same kind), or
// says why it cannot: the caller must then refuse tensor parallelism.
type Connector interface {
	Connect(ranks []Backend) (Comm, error)
}
