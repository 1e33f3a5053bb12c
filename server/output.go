package server

import (
	"strings"

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
	stops []string

	held    []token
	heldLen []int  // bytes of text each held token added
	text    string // the held tokens' text
	sent    int    // bytes released so far
	stopped string // the stop string that ended the output
}

func newTextOut(tok *tokenizer.Tokenizer, stops []string) *textOut {
	return &textOut{dec: tok.NewStreamDecoder(true), stops: stops}
}

// add takes the next token and returns what can be released now. After a
// stop string matched, o.stopped is set and later tokens must not be added.
func (o *textOut) add(id int32, lp *engine.StepLogprobs) (delta, error) {
	piece, err := o.dec.Next(id)
	if err != nil {
		return delta{}, err
	}
	o.held = append(o.held, token{id: id, offset: o.sent + len(o.text), lp: lp})
	o.heldLen = append(o.heldLen, len(piece))
	o.text += piece
	if at := o.matchStop(); at >= 0 {
		return o.release(len(o.held), at), nil
	}
	free := len(o.text) - o.partialStop()
	n, end := 0, 0
	for n < len(o.held) && end+o.heldLen[n] <= free {
		end += o.heldLen[n]
		n++
	}
	return o.release(n, end), nil
}

// finish releases everything held, with any unfinished character at the
// end of the output (decoded as U+FFFD).
func (o *textOut) finish() delta {
	o.text += o.dec.Flush()
	end := len(o.text)
	if at := o.matchStop(); at >= 0 {
		end = at
	}
	return o.release(len(o.held), end)
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

// matchStop returns where the earliest stop string starts in the held text
// (setting o.stopped), or -1.
func (o *textOut) matchStop() int {
	at := -1
	for _, s := range o.stops {
		if i := strings.Index(o.text, s); i >= 0 && (at < 0 || i < at) {
			at, o.stopped = i, s
		}
	}
	return at
}

// partialStop is the length of the longest end of the held text that is the
// start of a stop string.
func (o *textOut) partialStop() int {
	longest := 0
	for _, s := range o.stops {
		for n := min(len(s)-1, len(o.text)); n > longest; n-- {
			if strings.HasSuffix(o.text, s[:n]) {
				longest = n
				break
			}
		}
	}
	return longest
}
