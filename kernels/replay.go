package kernels

import "fmt"

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
	// ConvCommitAt is ConvCommit of the node read at run time from nodeAt
	// (one I32, 0..maxNode), and GDNRecurrenceAt a chain's GDNRecurrence
	// from state to stateOut, without outputs, over the rows read from
	// rowsAt (one I32, 0..maxRows): recordings of them serve any accepted
	// chain (mamba.Verify.Commit). With slotAt (one I32, or nil) state and
	// stateOut hold states one after another and the one slotAt names is
	// committed (GDNConvSeq.SlotAt): they serve any slot too.
	ConvCommitAt(state, x, parents, nodeAt, slotAt Buffer, maxNode, channels, K int)
	GDNRecurrenceAt(q, k, v, g, beta, state, stateOut, rowsAt, slotAt Buffer, maxRows int, shape GDNShape)
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

// DriverCounts is the work a backend has asked of its driver: what a step
// costs in launches, allocations and host round trips, apart from the
// kernels' own time. Take the difference of two readings around a step.
// (The CUDA backend keeps it: Counts.)
type DriverCounts struct {
	// Launches counts kernel launches, library GEMMs and graph launches:
	// a replayed graph counts once, whatever it holds.
	Launches      int64
	Allocs        int64 // device allocations (buffers and scratch)
	Uploads       int64 // host→device copies
	UploadBytes   int64
	Downloads     int64 // device→host copies, each waiting for the device
	DownloadBytes int64
}

// Sub is c − d, the work between two readings.
func (c DriverCounts) Sub(d DriverCounts) DriverCounts {
	return DriverCounts{c.Launches - d.Launches, c.Allocs - d.Allocs, c.Uploads - d.Uploads, c.UploadBytes - d.UploadBytes,
		c.Downloads - d.Downloads, c.DownloadBytes - d.DownloadBytes}
}

// Per is c divided over n steps, rounded to whole calls and bytes.
func (c DriverCounts) Per(n int64) DriverCounts {
	if n <= 0 {
		return DriverCounts{}
	}
	div := func(v int64) int64 { return (v + n/2) / n }
	return DriverCounts{div(c.Launches), div(c.Allocs), div(c.Uploads), div(c.UploadBytes), div(c.Downloads), div(c.DownloadBytes)}
}

func (c DriverCounts) String() string {
	return fmt.Sprintf("%d launches, %d allocations, %d uploads (%d B), %d synchronising downloads (%d B)",
		c.Launches, c.Allocs, c.Uploads, c.UploadBytes, c.Downloads, c.DownloadBytes)
}
