//go:build cgo

package cuda

/*
#include "driver.h"
*/
import "C"

import (
	"errors"
	"time"

	"ddflash/kernels"
)

// Graph is a captured sequence of ops that Launch replays with the same
// buffers (their contents may change between replays: upload a step's
// inputs into fixed buffers, then launch).
type Graph struct {
	be   *Backend
	exec C.CUgraphExec
}

// BeginCapture starts recording the ops issued from now on into a graph
// instead of running them. Alloc, uploads, downloads and Sync fail while
// capturing, and ops must not need more scratch memory than an earlier,
// uncaptured run of the same step did. A graph keeps using the buffers and
// scratch memory it was captured with: free none of them while it lives.
func (be *Backend) BeginCapture() error {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.capturing {
		return errors.New("cuda: BeginCapture while already capturing")
	}
	if err := be.syncLocked(); err != nil {
		return err
	}
	if err := check("cuStreamBeginCapture", C.dd_capture_begin(be.ctx, be.stream)); err != nil {
		return err
	}
	be.capturing = true
	return nil
}

// EndCapture stops recording and returns the graph, ready to Launch.
func (be *Backend) EndCapture() (*Graph, error) {
	be.mu.Lock()
	defer be.mu.Unlock()
	if !be.capturing {
		return nil, errors.New("cuda: EndCapture without BeginCapture")
	}
	be.capturing = false
	g := &Graph{be: be}
	err := check("cuStreamEndCapture", C.dd_capture_end(be.ctx, be.stream, &g.exec))
	if failed := be.asyncError; failed != nil {
		be.asyncError = nil
		err = errors.Join(failed, err)
	}
	if err != nil {
		if g.exec != nil {
			C.dd_graph_destroy(be.ctx, g.exec)
		}
		return nil, err
	}
	be.graphs++
	return g, nil
}

// Launch queues a replay of g.
func (be *Backend) Launch(g *Graph) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	be.counts.Launches++
	return check("cuGraphLaunch", C.dd_graph_launch(be.ctx, g.exec, be.stream))
}

// Capture records the ops record issues as a graph instead of running
// them (kernels.Replayer): BeginCapture, record, EndCapture.
func (be *Backend) Capture(record func() error) (kernels.Graph, error) {
	if err := be.BeginCapture(); err != nil {
		return nil, err
	}
	err := record()
	g, endErr := be.EndCapture()
	if err = errors.Join(err, endErr); err != nil {
		if g != nil {
			g.Close()
		}
		return nil, err
	}
	return g, nil
}

// Replay queues a replay of g (kernels.Graph).
func (g *Graph) Replay() error { return g.be.Launch(g) }

// Close frees the graph, and the scratch memory only closed graphs used.
func (g *Graph) Close() {
	be := g.be
	be.mu.Lock()
	defer be.mu.Unlock()
	if g.exec == nil {
		return
	}
	C.dd_graph_destroy(be.ctx, g.exec)
	g.exec = nil
	if be.graphs--; be.graphs == 0 && len(be.retired) > 0 {
		be.fail(check("cuStreamSynchronize", C.dd_stream_sync(be.ctx, be.stream)))
		for i := range be.retired {
			be.retired[i].free(be)
		}
		be.retired = nil
	}
}

// Time runs fn (which issues ops) and returns the device time from its
// first op to the end of its last, measured with events on the stream.
func (be *Backend) Time(fn func()) (time.Duration, error) {
	var start, end C.CUevent
	be.mu.Lock()
	err := errors.Join(check("cuEventCreate", C.dd_event_create(be.ctx, &start)), check("cuEventCreate", C.dd_event_create(be.ctx, &end)))
	defer func() {
		be.mu.Lock()
		C.dd_event_destroy(be.ctx, start)
		C.dd_event_destroy(be.ctx, end)
		be.mu.Unlock()
	}()
	if err == nil {
		err = check("cuEventRecord", C.dd_event_record(be.ctx, start, be.stream))
	}
	be.mu.Unlock()
	if err != nil {
		return 0, err
	}
	fn()
	be.mu.Lock()
	defer be.mu.Unlock()
	var ms C.float
	if err := check("cuEventRecord", C.dd_event_record(be.ctx, end, be.stream)); err != nil {
		return 0, err
	}
	if err := check("cuEventElapsedTime", C.dd_event_elapsed(be.ctx, &ms, start, end)); err != nil {
		return 0, err
	}
	if err := be.asyncError; err != nil {
		be.asyncError = nil
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}
