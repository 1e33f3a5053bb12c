package kernels

// Replayer is a Backend that can record a step's ops once and replay them
// (the CUDA backend's graphs), so that a step costs one launch instead of
// one per op. A recorded step keeps its buffers and launch shapes: every
// value that changes from step to step must come from device memory. The
// step uploads them first, in one copy; attention reads its sequences from
// a device table for that reason (AttentionTable).
type Replayer interface {
	Backend
	// AttnTableLen is the I32 elements of an attention table for n sequences.
	AttnTableLen(n int) int
	// EncodeAttnTable writes the table of seqs into dst (AttnTableLen
	// elements). It holds the device addresses of their Pages and Mask
	// buffers, which must stay allocated while the table is used.
	EncodeAttnTable(dst []int32, seqs []AttnSeq, pageSize int)
	// AttentionTable is Attention over seqs reading their descriptors at
	// run time from table (encoded by EncodeAttnTable and uploaded; at an
	// even element offset of an I32 buffer). Its launches depend only on
	// the sequences' query lengths and on maxKeys, which bounds every
	// sequence's Prefix+QueryLen and sets how keys split among blocks.
	AttentionTable(out, q, kCache, vCache Buffer, shape AttnShape, seqs []AttnSeq, table Buffer, maxKeys int)
	// TopKLSE reduces each of rows rows of x, ld elements apart, of which
	// the first n count, to out [rows, 2k+1] (F32): the k largest values,
	// best first (ties: lower index first), their indices as floats
	// (exact: n <= 2^24) and the row's log-sum-exp. One download then
	// brings a step's top-k home.
	TopKLSE(out, x Buffer, rows, n, ld, k int)
	// Capture records the ops record issues as a graph instead of running
	// them. Allocations and host transfers fail while it records.
	Capture(record func() error) (Graph, error)
}

// Graph is a recorded step.
type Graph interface {
	// Replay queues the recorded ops again, on the buffers they were
	// recorded with (whose contents may have changed).
	Replay() error
	Close()
}
