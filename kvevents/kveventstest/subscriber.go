// Package kveventstest is a KV events subscriber for tests: a go-zeromq SUB
// socket, as the llm-d router's, whose messages it decodes the way the
// router's vLLM adapter does (msgpack into generic values, fields by
// position), independently of the publisher's encoder.
package kveventstest

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// Message is one decoded message.
type Message struct {
	Topic  string
	Seq    uint64
	Time   float64
	Rank   int64
	Events []Event
}

// Event is one decoded event; the fields a kind does not have are zero.
type Event struct {
	Kind      string // BlockStored, BlockRemoved, AllBlocksCleared
	Hashes    []uint64
	Parent    uint64 // 0: none (nil on the wire)
	Tokens    []int32
	BlockSize int
	Medium    string
	GroupIdx  int
	SpecKind  string
}

// Subscriber is a connected SUB socket whose messages one goroutine
// receives and decodes.
type Subscriber struct {
	sock     zmq4.Socket
	messages chan received
}

type received struct {
	msg Message
	err error
}

// Subscribe dials addr ("tcp://127.0.0.1:5557") and subscribes to topics
// that start with prefix. The socket closes with the test.
func Subscribe(t testing.TB, addr, prefix string) *Subscriber {
	t.Helper()
	s := &Subscriber{sock: zmq4.NewSub(context.Background()), messages: make(chan received, 1024)}
	t.Cleanup(func() { s.sock.Close() })
	if err := s.sock.Dial(addr); err != nil {
		t.Fatal(err)
	}
	if err := s.sock.SetOption(zmq4.OptionSubscribe, prefix); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			raw, err := s.sock.Recv()
			if err != nil {
				s.messages <- received{err: err}
				return
			}
			m, err := Decode(raw.Frames)
			s.messages <- received{m, err}
		}
	}()
	return s
}

// Receive waits up to timeout for the next message; ok is false when none came.
func (s *Subscriber) Receive(t testing.TB, timeout time.Duration) (m Message, ok bool) {
	t.Helper()
	select {
	case r := <-s.messages:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.msg, true
	case <-time.After(timeout):
		return Message{}, false
	}
}

// Next is Receive that fails the test when no message comes.
func (s *Subscriber) Next(t testing.TB, timeout time.Duration) Message {
	t.Helper()
	m, ok := s.Receive(t, timeout)
	if !ok {
		t.Fatalf("no KV events message within %v", timeout)
	}
	return m
}

// Decode reads a message's frames: topic, 8-byte big-endian sequence
// number, and the msgpack payload [timestamp, [events...], rank].
func Decode(frames [][]byte) (Message, error) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		return Message{}, fmt.Errorf("want 3 frames, the second of 8 bytes; got %d", len(frames))
	}
	m := Message{Topic: string(frames[0]), Seq: binary.BigEndian.Uint64(frames[1])}
	var payload []any
	if err := msgpack.Unmarshal(frames[2], &payload); err != nil {
		return m, err
	}
	if len(payload) != 3 {
		return m, fmt.Errorf("payload of %d fields, want [timestamp, events, rank]", len(payload))
	}
	var ok bool
	if m.Time, ok = payload[0].(float64); !ok {
		return m, fmt.Errorf("timestamp %T", payload[0])
	}
	rank, err := integer(payload[2])
	if err != nil {
		return m, fmt.Errorf("rank: %w", err)
	}
	m.Rank = rank
	events, ok := payload[1].([]any)
	if !ok {
		return m, fmt.Errorf("events %T", payload[1])
	}
	for i, raw := range events {
		ev, err := decodeEvent(raw)
		if err != nil {
			return m, fmt.Errorf("event %d: %w", i, err)
		}
		m.Events = append(m.Events, ev)
	}
	return m, nil
}

func decodeEvent(raw any) (Event, error) {
	f, ok := raw.([]any)
	if !ok || len(f) == 0 {
		return Event{}, fmt.Errorf("not a positional array: %T", raw)
	}
	var ev Event
	if ev.Kind, ok = f[0].(string); !ok {
		return ev, fmt.Errorf("tag %T", f[0])
	}
	var err error
	switch ev.Kind {
	case "AllBlocksCleared":
		if len(f) != 1 {
			return ev, fmt.Errorf("AllBlocksCleared with %d fields", len(f))
		}
		return ev, nil
	case "BlockStored":
		if len(f) != 12 {
			return ev, fmt.Errorf("BlockStored with %d fields, want 12", len(f))
		}
		if ev.Hashes, err = hashes(f[1]); err != nil {
			return ev, err
		}
		if f[2] != nil {
			if ev.Parent, ok = f[2].(uint64); !ok {
				return ev, fmt.Errorf("parent hash %T", f[2])
			}
		}
		tokens, ok := f[3].([]any)
		if !ok {
			return ev, fmt.Errorf("token_ids %T", f[3])
		}
		for _, tok := range tokens {
			n, err := integer(tok)
			if err != nil {
				return ev, fmt.Errorf("token: %w", err)
			}
			ev.Tokens = append(ev.Tokens, int32(n))
		}
		size, err := integer(f[4])
		if err != nil {
			return ev, fmt.Errorf("block_size: %w", err)
		}
		ev.BlockSize = int(size)
		if f[5] != nil || f[7] != nil || f[8] != nil || f[11] != nil {
			return ev, fmt.Errorf("lora_id, lora_name, extra_keys, sliding_window: %v %v %v %v, want nil", f[5], f[7], f[8], f[11])
		}
		ev.Medium, _ = f[6].(string)
		group, err := integer(f[9])
		if err != nil {
			return ev, fmt.Errorf("group_idx: %w", err)
		}
		ev.GroupIdx = int(group)
		ev.SpecKind, _ = f[10].(string)
	case "BlockRemoved":
		if len(f) != 4 {
			return ev, fmt.Errorf("BlockRemoved with %d fields, want 4", len(f))
		}
		if ev.Hashes, err = hashes(f[1]); err != nil {
			return ev, err
		}
		ev.Medium, _ = f[2].(string)
		group, err := integer(f[3])
		if err != nil {
			return ev, fmt.Errorf("group_idx: %w", err)
		}
		ev.GroupIdx = int(group)
	default:
		return ev, fmt.Errorf("unknown tag %q", ev.Kind)
	}
	return ev, nil
}

// hashes are block hashes, which the router reads as uint64 (or int64, or bytes).
func hashes(raw any) ([]uint64, error) {
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("block_hashes %T", raw)
	}
	out := make([]uint64, len(list))
	for i, h := range list {
		if out[i], ok = h.(uint64); !ok {
			return nil, fmt.Errorf("block hash %T, want uint64", h)
		}
	}
	return out, nil
}

// integer is a msgpack integer, whatever width it was written in.
func integer(v any) (int64, error) {
	switch n := v.(type) {
	case int8:
		return int64(n), nil
	case int16:
		return int64(n), nil
	case int32:
		return int64(n), nil
	case int64:
		return n, nil
	case uint8:
		return int64(n), nil
	case uint16:
		return int64(n), nil
	case uint32:
		return int64(n), nil
	case uint64:
		return int64(n), nil
	}
	return 0, fmt.Errorf("%T is not an integer", v)
}

// Index is what a router learns from the events: the blocks stored and
// not removed since, chained by parent, and which of them ended a stored
// run (a prefix the engine said it can resume).
type Index struct {
	parent map[uint64]uint64
	tokens map[uint64][]int32
	ends   map[uint64]bool
}

// NewIndex is an empty index.
func NewIndex() *Index {
	return &Index{parent: map[uint64]uint64{}, tokens: map[uint64][]int32{}, ends: map[uint64]bool{}}
}

// Apply takes one event in, failing on one that contradicts what came
// before: a parent or a removed block that is not stored, a block stored
// twice, tokens that are not whole blocks.
func (x *Index) Apply(ev Event) error {
	switch ev.Kind {
	case "AllBlocksCleared":
		*x = *NewIndex()
	case "BlockStored":
		if ev.Parent != 0 && x.tokens[ev.Parent] == nil {
			return fmt.Errorf("blocks %v stored after block %d, which is not stored", ev.Hashes, ev.Parent)
		}
		if ev.BlockSize <= 0 || len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize {
			return fmt.Errorf("%d blocks of %d tokens stored with %d tokens", len(ev.Hashes), ev.BlockSize, len(ev.Tokens))
		}
		parent := ev.Parent
		for i, h := range ev.Hashes {
			if x.tokens[h] != nil {
				return fmt.Errorf("block %d stored twice", h)
			}
			x.parent[h], x.tokens[h] = parent, ev.Tokens[i*ev.BlockSize:(i+1)*ev.BlockSize]
			parent = h
		}
		x.ends[parent] = true
	case "BlockRemoved":
		for _, h := range ev.Hashes {
			if x.tokens[h] == nil {
				return fmt.Errorf("block %d removed, which is not stored", h)
			}
			delete(x.parent, h)
			delete(x.tokens, h)
			delete(x.ends, h)
		}
	}
	return nil
}

// Blocks is the number of blocks stored.
func (x *Index) Blocks() int { return len(x.tokens) }

// Prefixes are the token prefixes that end stored runs.
func (x *Index) Prefixes() [][]int32 {
	var out [][]int32
	for h := range x.ends {
		var blocks [][]int32
		for b := h; b != 0; b = x.parent[b] {
			blocks = append(blocks, x.tokens[b])
		}
		slices.Reverse(blocks)
		out = append(out, slices.Concat(blocks...))
	}
	return out
}
