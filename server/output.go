package server

import (
	"cmp"
	"slices"

	"ddflash/engine"
	"ddflash/tokenizer"
)

// token is one generated token as reported to the client.
type token struct {
	id     int32
	offset int                  // where its text starts in the completion text
	lp     *engine.StepLogprobs // nil unless logprobs were asked for
}

// delta is output released to the client: text and the tokens it came
// from, and for chat the text split into content, reasoning and tool calls.
type delta struct {
	text   string
	tokens []token
	split  parsed
}

// append adds d's output to a.
func (a *delta) append(d delta) {
	a.text += d.text
	a.tokens = append(a.tokens, d.tokens...)
	a.split.add(d.split)
}

// textOut turns generated tokens into text. Stop strings are honoured across
// token boundaries: text that could be the start of a stop string is held
// back until it is known not to be, and a stop string never reaches the
// client. Tokens are released whole, with their text, so that logprobs and
// text stay aligned.
type textOut struct {
	dec   *tokenizer.StreamDecoder
	stops *stopMatcher

	held    []token
	heldLen []int  // bytes of text each held token added
	text    string // the held tokens' text
	sent    int    // bytes released so far
	stopped string // the stop string that ended the output
}

func newTextOut(tok *tokenizer.Tokenizer, stops []string) *textOut {
	return &textOut{dec: tok.NewStreamDecoder(true), stops: newStopMatcher(stops)}
}

// add takes the next token and returns what can be released now. After a
// stop string matched, o.stopped is set and later tokens must not be added.
func (o *textOut) add(id int32, lp *engine.StepLogprobs) (delta, error) {
	piece, err := o.dec.Next(id)
	if err != nil {
		return delta{}, err
	}
	return o.addText(token{id: id, lp: lp}, piece), nil
}

// addText takes a token with the text it decoded to.
func (o *textOut) addText(t token, piece string) delta {
	t.offset = o.sent + len(o.text)
	o.held = append(o.held, t)
	o.heldLen = append(o.heldLen, len(piece))
	if at := o.feed(piece); at >= 0 {
		return o.release(len(o.held), at)
	}
	free := len(o.text) - o.stops.partial()
	n, end := 0, 0
	for n < len(o.held) && end+o.heldLen[n] <= free {
		end += o.heldLen[n]
		n++
	}
	return o.release(n, end)
}

// finish releases everything held, with any unfinished character at the
// end of the output (decoded as U+FFFD).
func (o *textOut) finish() delta { return o.finishText(o.dec.Flush()) }

// finishText releases everything held after adding rest, the decoder's
// last text.
func (o *textOut) finishText(rest string) delta {
	end := o.feed(rest)
	if end < 0 {
		end = len(o.text)
	}
	return o.release(len(o.held), end)
}

// feed appends piece to the held text and returns where in it the first
// stop string starts (setting o.stopped), or -1.
func (o *textOut) feed(piece string) int {
	o.text += piece
	at, stop := o.stops.feed(piece)
	if stop < 0 {
		return -1
	}
	o.stopped = o.stops.stops[stop]
	return at - o.sent
}

// release hands out the first n held tokens and end bytes of held text.
func (o *textOut) release(n, end int) delta {
	d := delta{text: o.text[:end], tokens: o.held[:n:n]}
	for i := range d.tokens {
		d.tokens[i].offset = min(d.tokens[i].offset, o.sent+end) // tokens past a stop string's cut
	}
	o.text = o.text[end:]
	o.held, o.heldLen = o.held[n:], o.heldLen[n:]
	o.sent += end
	return d
}

// Bounds on a request's stop strings, which keep the matcher small.
const (
	maxStops     = 16
	maxStopBytes = 256
)

// checkStops refuses more stop strings, or longer ones, than the bounds.
func checkStops(stops []string) error {
	if len(stops) > maxStops {
		return badRequest("stop", "stop: %d strings, the limit is %d", len(stops), maxStops)
	}
	for i, s := range stops {
		if len(s) > maxStopBytes {
			return badRequest("stop", "stop[%d] is %d bytes long, the limit is %d bytes", i, len(s), maxStopBytes)
		}
	}
	return nil
}

// stopMatcher finds stop strings in text fed to it piece by piece, in time
// linear in the text: an Aho–Corasick automaton over the strings' bytes.
// Its state is the longest end of the text so far that begins a stop string.
type stopMatcher struct {
	stops []string
	nodes []stopNode
	edges map[uint32]int32 // node<<8 | byte → child
	state int32
	fed   int // bytes fed so far
}

type stopNode struct {
	depth int32 // bytes from the root: the length of the prefix it stands for
	fail  int32 // the node of its longest proper suffix that begins a stop string
	stop  int32 // the first stop string (by index) that ends here, or -1
	dict  int32 // the nearest node down the fail chain where one ends, or -1
}

func newStopMatcher(stops []string) *stopMatcher {
	m := &stopMatcher{stops: stops, nodes: []stopNode{{stop: -1, dict: -1}}, edges: map[uint32]int32{}}
	for i, s := range stops {
		n := int32(0)
		for j := range len(s) {
			key := uint32(n)<<8 | uint32(s[j])
			child, ok := m.edges[key]
			if !ok {
				child = int32(len(m.nodes))
				m.nodes = append(m.nodes, stopNode{depth: int32(j + 1), stop: -1, dict: -1})
				m.edges[key] = child
			}
			n = child
		}
		if m.nodes[n].stop < 0 {
			m.nodes[n].stop = int32(i)
		}
	}
	// Fail links in order of depth: a node's parent, and every node its
	// fail link can reach, come before it.
	parent := make([]int32, len(m.nodes))
	label := make([]byte, len(m.nodes))
	for key, child := range m.edges {
		parent[child], label[child] = int32(key>>8), byte(key)
	}
	order := make([]int32, len(m.nodes))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(m.nodes[a].depth, m.nodes[b].depth) })
	for _, n := range order[1:] {
		node := &m.nodes[n]
		if p := parent[n]; p != 0 {
			node.fail = m.next(m.nodes[p].fail, label[n])
		}
		f := m.nodes[node.fail]
		node.dict = f.dict
		if f.stop >= 0 {
			node.dict = node.fail
		}
	}
	return m
}

// next is the automaton's transition: the node for the longest end of
// (prefix of n) + c that begins a stop string.
func (m *stopMatcher) next(n int32, c byte) int32 {
	for {
		if child, ok := m.edges[uint32(n)<<8|uint32(c)]; ok {
			return child
		}
		if n == 0 {
			return 0
		}
		n = m.nodes[n].fail
	}
}

// feed scans piece and returns where the earliest-starting stop string that
// ends inside it starts (counting every byte fed so far) and its index; the
// first listed wins a tie. It returns -1, -1 when none ends in piece.
func (m *stopMatcher) feed(piece string) (at, stop int) {
	at, stop = -1, -1
	for i := range len(piece) {
		m.state = m.next(m.state, piece[i])
		end := m.fed + i + 1
		for n := m.state; n >= 0; n = m.nodes[n].dict {
			node := m.nodes[n]
			if node.stop < 0 {
				continue // only the state itself may end no stop string
			}
			start := end - int(node.depth)
			if at < 0 || start < at || (start == at && int(node.stop) < stop) {
				at, stop = start, int(node.stop)
			}
		}
	}
	m.fed += len(piece)
	return at, stop
}

// partial is the length of the longest end of the text fed that begins a
// stop string (and, while none has matched, is not one).
func (m *stopMatcher) partial() int { return int(m.nodes[m.state].depth) }
