package kvevents

import (
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"ddflash/engine"
	"ddflash/kvevents/kveventstest"
)

const testTopic = "kv@127.0.0.1:8000@tiny"

// listening binds a publisher on loopback and connects a subscriber; the
// publisher starts sending once the subscription has reached it, so that
// the subscriber sees everything from AllBlocksCleared on.
func listening(t *testing.T) (*Publisher, *kveventstest.Subscriber) {
	t.Helper()
	p, err := listen("tcp://127.0.0.1:0", testTopic, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	sub := kveventstest.Subscribe(t, "tcp://"+p.Addr().String(), "kv@")
	waitSubscribed(t, p)
	return p, sub
}

func waitSubscribed(t *testing.T, p *Publisher) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n := 0
		for s := range p.subs {
			if s.subscribed(p.topic) {
				n++
			}
		}
		p.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the subscription did not reach the publisher")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWireFormat publishes a stored run, its child and a removal, and
// decodes them as the llm-d router does: AllBlocksCleared first, then the
// positional fields, with sequence numbers counting up from 0.
func TestWireFormat(t *testing.T) {
	p, sub := listening(t)
	tokens := make([]int32, 32)
	for i := range tokens {
		tokens[i] = int32(1000 + i)
	}
	p.start()
	first := sub.Next(t, 5*time.Second)
	if first.Topic != testTopic || first.Seq != 0 || len(first.Events) != 1 || first.Events[0].Kind != "AllBlocksCleared" {
		t.Fatalf("first message: %+v, want AllBlocksCleared on %q with sequence number 0", first, testTopic)
	}
	sent := []engine.CacheEvent{
		{Kind: engine.BlocksStored, Blocks: []uint64{1, 2}, Tokens: tokens, BlockSize: 16},
		{Kind: engine.BlocksStored, Blocks: []uint64{3}, Parent: 2, Tokens: tokens[:16], BlockSize: 16},
		{Kind: engine.BlocksRemoved, Blocks: []uint64{3, 2}},
	}
	var got []kveventstest.Event
	seq := first.Seq
	for _, ev := range sent {
		p.Publish(ev)
	}
	for len(got) < len(sent) {
		m := sub.Next(t, 5*time.Second)
		if m.Seq != seq+1 || m.Rank != 0 || m.Time < float64(time.Now().Add(-time.Minute).Unix()) {
			t.Fatalf("message %+v: want sequence number %d, rank 0, a timestamp of now", m, seq+1)
		}
		seq = m.Seq
		got = append(got, m.Events...)
	}
	want := []kveventstest.Event{
		{Kind: "BlockStored", Hashes: []uint64{1, 2}, Tokens: tokens, BlockSize: 16, Medium: "GPU", SpecKind: "full_attention"},
		{Kind: "BlockStored", Hashes: []uint64{3}, Parent: 2, Tokens: tokens[:16], BlockSize: 16, Medium: "GPU", SpecKind: "full_attention"},
		{Kind: "BlockRemoved", Hashes: []uint64{3, 2}, Medium: "GPU"},
	}
	if !slices.EqualFunc(got, want, equalEvents) {
		t.Fatalf("decoded %+v\nwant %+v", got, want)
	}
	if p.Published() != 4 || p.Dropped() != 0 {
		t.Fatalf("published %d dropped %d, want 4 and 0", p.Published(), p.Dropped())
	}
}

func equalEvents(a, b kveventstest.Event) bool {
	return a.Kind == b.Kind && slices.Equal(a.Hashes, b.Hashes) && a.Parent == b.Parent && slices.Equal(a.Tokens, b.Tokens) &&
		a.BlockSize == b.BlockSize && a.Medium == b.Medium && a.GroupIdx == b.GroupIdx && a.SpecKind == b.SpecKind
}

// TestPublishNeverBlocks: with the sender not keeping up (not started
// here), Publish returns at once and drops what the queue cannot hold,
// and the subscriber sees the loss as a gap in the sequence numbers.
func TestPublishNeverBlocks(t *testing.T) {
	p, sub := listening(t)
	const extra = 10
	start := time.Now()
	for i := range queueLen - 1 + extra { // AllBlocksCleared holds one place
		p.Publish(engine.CacheEvent{Kind: engine.BlocksRemoved, Blocks: []uint64{uint64(i + 1)}})
	}
	if d := time.Since(start); d > time.Second || p.Dropped() != extra {
		t.Fatalf("publishing took %v and dropped %d events, want at once and %d", d, p.Dropped(), extra)
	}
	p.start()
	if m := sub.Next(t, 5*time.Second); m.Seq != extra || m.Events[0].Kind != "AllBlocksCleared" {
		t.Fatalf("first message: sequence number %d, %s; want %d (the gap of the dropped events), AllBlocksCleared", m.Seq, m.Events[0].Kind, extra)
	}
}

// TestSlowSubscriberDrops: a subscriber whose queue is full misses the
// message, counted once per event, and the others still get it.
func TestSlowSubscriberDrops(t *testing.T) {
	p, err := listen("tcp://127.0.0.1:0", testTopic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	slow := &subscriber{out: make(chan zmq4.Msg, 1), prefixes: []string{"kv@"}}
	fast := &subscriber{out: make(chan zmq4.Msg, 2), prefixes: []string{""}}
	other := &subscriber{out: make(chan zmq4.Msg, 2), prefixes: []string{"other"}}
	p.subs = map[*subscriber]bool{slow: true, fast: true, other: true}
	msg := zmq4.NewMsgFrom([]byte(testTopic), make([]byte, 8), nil)
	p.broadcast(msg, 3)
	p.broadcast(msg, 3)
	if len(slow.out) != 1 || len(fast.out) != 2 || len(other.out) != 0 || p.Dropped() != 3 {
		t.Fatalf("queued slow %d fast %d other %d, dropped %d; want 1, 2, 0 and 3", len(slow.out), len(fast.out), len(other.out), p.Dropped())
	}
	p.subs = map[*subscriber]bool{} // not connected: Close has nothing of theirs to close
}

func TestListenAddr(t *testing.T) {
	for endpoint, want := range map[string]string{
		"tcp://*:5557": ":5557", "tcp://127.0.0.1:5558": "127.0.0.1:5558", "tcp://[::1]:5557": "[::1]:5557",
		"127.0.0.1:5557": "", "ipc:///tmp/x": "", "tcp://127.0.0.1": "",
	} {
		got, err := listenAddr(endpoint)
		if got != want || (err != nil) != (want == "") {
			t.Errorf("%q: %q %v, want %q", endpoint, got, err, want)
		}
	}
}
