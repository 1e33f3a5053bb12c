// Package kvevents publishes the engine's prefix-cache events as vLLM's KV
// events, which the llm-d router's precise prefix-cache scorer (and NVIDIA
// Dynamo's KV router) read to send a request to the replica that holds its
// prefix.
//
// The wire format is vLLM's ZMQ publisher's: a PUB socket whose messages
// are three frames, [topic, 8-byte big-endian sequence number, msgpack
// payload]; the payload is [timestamp, [events...], data-parallel rank],
// each event a positional array:
//
//	["BlockStored", block_hashes, parent_block_hash|nil, token_ids, block_size,
//	 lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind, sliding_window]
//	["BlockRemoved", block_hashes, medium, group_idx]
//	["AllBlocksCleared"]
//
// Blocks are KV pages of the full-attention layers (group 0,
// "full_attention"): the only ones a router indexes for a hybrid model.
// Their hashes are the engine's opaque block IDs; a router recomputes its
// own keys from token_ids.
//
// Publishing never blocks the engine: events queue for a sender goroutine,
// and each subscriber has its own bounded queue. What does not fit is
// dropped and counted; the subscriber sees a gap in the sequence numbers.
package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"ddflash/engine"
)

const (
	queueLen      = 4096 // events waiting for the sender
	subscriberLen = 256  // messages waiting for one subscriber
	maxBatch      = 64   // events per message
	handshakeTime = 5 * time.Second
)

// Publisher is a ZMQ PUB socket for the engine's cache events.
type Publisher struct {
	ln     net.Listener
	topic  []byte
	log    *slog.Logger
	events chan event
	stop   chan struct{}
	wg     sync.WaitGroup

	mu   sync.Mutex
	subs map[*subscriber]bool

	seq       uint64        // the next message's sequence number (sender goroutine)
	lost      atomic.Uint64 // events dropped before the sender took them, not yet skipped in seq
	published atomic.Uint64
	dropped   atomic.Uint64
}

// event is one engine event, or AllBlocksCleared (cleared).
type event struct {
	engine.CacheEvent
	cleared bool
}

// Listen binds a PUB socket to endpoint ("tcp://*:5557", "tcp://127.0.0.1:0")
// and publishes AllBlocksCleared, so that a router forgets what an earlier
// process on this address advertised. topic is vLLM's "kv@<pod>@<model>".
func Listen(endpoint, topic string, log *slog.Logger) (*Publisher, error) {
	p, err := listen(endpoint, topic, log)
	if err != nil {
		return nil, err
	}
	p.start()
	return p, nil
}

// listen binds the socket and queues AllBlocksCleared; start sends.
func listen(endpoint, topic string, log *slog.Logger) (*Publisher, error) {
	addr, err := listenAddr(endpoint)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("KV events endpoint %q: %w", endpoint, err)
	}
	if log == nil {
		log = slog.Default()
	}
	p := &Publisher{ln: ln, topic: []byte(topic), log: log,
		events: make(chan event, queueLen), stop: make(chan struct{}), subs: map[*subscriber]bool{}}
	p.events <- event{cleared: true}
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.accept() }()
	return p, nil
}

// listenAddr is the TCP address of a ZMQ endpoint, "tcp://HOST:PORT"
// (HOST * for every interface, as ZMQ writes it).
func listenAddr(endpoint string) (string, error) {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	host, port, err := net.SplitHostPort(addr)
	if !ok || err != nil {
		return "", fmt.Errorf("KV events endpoint %q: want tcp://HOST:PORT (HOST * for every interface)", endpoint)
	}
	if host == "*" {
		host = ""
	}
	return net.JoinHostPort(host, port), nil
}

func (p *Publisher) start() {
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.send() }()
}

// Addr is the address the socket listens on.
func (p *Publisher) Addr() net.Addr { return p.ln.Addr() }

// Publish queues an engine event; it never blocks (engine.SetCacheEvents).
func (p *Publisher) Publish(ev engine.CacheEvent) {
	select {
	case p.events <- event{CacheEvent: ev}:
	default:
		p.dropped.Add(1)
		p.lost.Add(1)
	}
}

// Published is the number of events sent (to every subscriber there was).
func (p *Publisher) Published() uint64 { return p.published.Load() }

// Dropped is the number of events lost for want of room: in the queue to
// the sender, or, once per subscriber, in a slow subscriber's queue.
func (p *Publisher) Dropped() uint64 { return p.dropped.Load() }

// Close stops publishing and closes the socket and its connections.
func (p *Publisher) Close() error {
	close(p.stop)
	err := p.ln.Close()
	p.mu.Lock()
	for s := range p.subs {
		s.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// accept takes subscribers' connections until the socket closes.
func (p *Publisher) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.log.Warn("KV events: accept failed", "error", err)
			}
			return
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.serve(c) }()
	}
}

// serve does a subscriber's ZMTP handshake, then reads its subscriptions
// while its writer sends what it subscribed to.
func (p *Publisher) serve(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(handshakeTime))
	conn, err := zmq4.Open(c, null.Security(), zmq4.Pub, nil, true, nil)
	if err != nil {
		p.log.Warn("KV events: ZMTP handshake failed", "peer", c.RemoteAddr(), "error", err)
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	s := &subscriber{conn: conn, out: make(chan zmq4.Msg, subscriberLen), done: make(chan struct{})}
	p.mu.Lock()
	select {
	case <-p.stop:
		p.mu.Unlock()
		conn.Close()
		return
	default:
	}
	p.subs[s] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.subs, s)
		p.mu.Unlock()
		s.close()
	}()
	p.wg.Add(1)
	go func() { defer p.wg.Done(); s.write() }()
	s.readSubscriptions()
}

// send batches queued events into messages for the subscribers.
func (p *Publisher) send() {
	for {
		var first event
		select {
		case <-p.stop:
			return
		case first = <-p.events:
		}
		batch := []event{first}
	drain:
		for len(batch) < maxBatch {
			select {
			case ev := <-p.events:
				batch = append(batch, ev)
			default:
				break drain
			}
		}
		payload, err := encodeBatch(batch)
		if err != nil {
			p.log.Error("KV events: encoding failed", "error", err)
			continue
		}
		p.seq += p.lost.Swap(0) // a gap the subscribers can see
		seq := make([]byte, 8)
		binary.BigEndian.PutUint64(seq, p.seq)
		p.seq++
		p.published.Add(uint64(len(batch))) // before a subscriber can see them
		p.broadcast(zmq4.NewMsgFrom(p.topic, seq, payload), len(batch))
	}
}

// broadcast hands a message of n events to every subscriber to its topic.
func (p *Publisher) broadcast(msg zmq4.Msg, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.subs {
		if !s.subscribed(p.topic) {
			continue
		}
		select {
		case s.out <- msg:
		default:
			p.dropped.Add(uint64(n))
		}
	}
}

// subscriber is one SUB connection.
type subscriber struct {
	conn      *zmq4.Conn
	out       chan zmq4.Msg
	done      chan struct{}
	closeOnce sync.Once

	mu       sync.Mutex
	prefixes []string // topic prefixes subscribed to
}

func (s *subscriber) close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.conn.Close()
	})
}

func (s *subscriber) subscribed(topic []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, prefix := range s.prefixes {
		if strings.HasPrefix(string(topic), prefix) {
			return true
		}
	}
	return false
}

// readSubscriptions applies (un)subscribe messages, a 1 or 0 byte then the
// topic prefix, until the connection ends.
func (s *subscriber) readSubscriptions() {
	for {
		msg, err := s.conn.RecvMsg()
		if err != nil {
			return
		}
		if len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 {
			continue
		}
		prefix := string(msg.Frames[0][1:])
		s.mu.Lock()
		switch msg.Frames[0][0] {
		case 1:
			s.prefixes = append(s.prefixes, prefix)
		case 0:
			if i := slices.Index(s.prefixes, prefix); i >= 0 {
				s.prefixes = slices.Delete(s.prefixes, i, i+1)
			}
		}
		s.mu.Unlock()
	}
}

// write sends queued messages until the connection fails or closes.
func (s *subscriber) write() {
	for {
		select {
		case <-s.done:
			return
		case msg := <-s.out:
			if err := s.conn.SendMsg(msg); err != nil {
				s.close()
				return
			}
		}
	}
}
