package server

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"ddflash/tokenizer"
)

// TestTextOutStopStrings feeds random token sequences (special tokens and
// characters split over tokens included) through textOut with stop strings
// cut out of their text, and checks against the whole decoded text: the
// output is the text before the first stop string, it ends at the token
// that completed it, nothing released ever contains a stop string, and
// released plus held text is always all that was decoded.
func TestTextOutStopStrings(t *testing.T) {
	_, _, tok := modelDirs(t)
	rng := rand.New(rand.NewPCG(7, 8))
	vocab := tok.VocabSize()
	matched := 0
	for trial := range 400 {
		ids := make([]int32, 1+rng.IntN(40))
		for i := range ids {
			ids[i] = int32(rng.IntN(vocab))
		}
		full, err := tok.Decode(ids, true)
		if err != nil {
			t.Fatal(err)
		}
		stops := []string{"\x00never\x00"}
		if runes := []rune(full); len(runes) > 2 && trial%4 != 0 {
			for range 1 + rng.IntN(2) {
				from := rng.IntN(len(runes) - 1)
				stop := string(runes[from:min(len(runes), from+1+rng.IntN(4))])
				if !strings.ContainsRune(stop, '\uFFFD') { // a cut character decodes otherwise in a prefix
					stops = append(stops, stop)
				}
			}
		}
		want, wantTokens := full, len(ids)
		if cut := firstStop(full, stops); cut >= 0 {
			matched++
			want = full[:cut]
			wantTokens = tokensUntil(t, tok, ids, stops...)
		}

		o := newTextOut(tok.Tokenizer, stops)
		var released strings.Builder
		tokens := 0
		for n, id := range ids {
			d, err := o.add(id, nil)
			if err != nil {
				t.Fatal(err)
			}
			released.WriteString(d.text)
			tokens += len(d.tokens)
			if o.stopped != "" {
				break
			}
			decoded := streamDecoded(t, tok.Tokenizer, ids[:n+1])
			if released.String()+o.text != decoded {
				t.Fatalf("trial %d: released %q + held %q, decoded %q", trial, released.String(), o.text, decoded)
			}
			for _, s := range stops {
				if strings.Contains(released.String(), s) {
					t.Fatalf("trial %d: stop %q released in %q", trial, s, released.String())
				}
			}
		}
		if o.stopped == "" {
			d := o.finish()
			released.WriteString(d.text)
			tokens += len(d.tokens)
		}
		if released.String() != want || tokens != wantTokens {
			t.Fatalf("trial %d, stops %q: released %q in %d tokens, want %q in %d\nfull %q", trial, stops, released.String(), tokens, want, wantTokens, full)
		}
	}
	if matched < 100 {
		t.Fatalf("only %d trials hit a stop string", matched)
	}
}

// firstStop is where the earliest stop string starts in text, or -1.
func firstStop(text string, stops []string) int {
	at := -1
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	return at
}

// streamDecoded is the text a stream decoder has produced after ids.
func streamDecoded(t *testing.T, tok *tokenizer.Tokenizer, ids []int32) string {
	t.Helper()
	dec := tok.NewStreamDecoder(true)
	var b strings.Builder
	for _, id := range ids {
		s, err := dec.Next(id)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(s)
	}
	return b.String()
}

// naiveOut is textOut as it was before the automaton, the reference the
// automaton must agree with: after every token it searches the held text for
// each stop string, and for the longest end of it that begins one.
type naiveOut struct {
	stops   []string
	text    string
	heldLen []int
	sent    int
	stopped string
}

func (o *naiveOut) add(piece string) (released string, tokens int) {
	o.heldLen = append(o.heldLen, len(piece))
	o.text += piece
	if at := o.matchStop(); at >= 0 {
		return o.release(len(o.heldLen), at)
	}
	free := len(o.text) - o.partialStop()
	n, end := 0, 0
	for n < len(o.heldLen) && end+o.heldLen[n] <= free {
		end += o.heldLen[n]
		n++
	}
	return o.release(n, end)
}

func (o *naiveOut) release(n, end int) (string, int) {
	text := o.text[:end]
	o.text, o.heldLen, o.sent = o.text[end:], o.heldLen[n:], o.sent+end
	return text, n
}

func (o *naiveOut) matchStop() int {
	at := -1
	for _, s := range o.stops {
		if i := strings.Index(o.text, s); i >= 0 && (at < 0 || i < at) {
			at, o.stopped = i, s
		}
	}
	return at
}

func (o *naiveOut) partialStop() int {
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

// TestTextOutMatchesNaive streams random pieces over a small alphabet (so
// that stop strings overlap, nest and repeat; a two-byte character
// included) through textOut and the naive reference: every step must
// release the same text and tokens, and stop on the same string.
func TestTextOutMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	alphabet := []string{"a", "b", "c", "é"}
	randText := func(maxParts int) string {
		var b strings.Builder
		for range rng.IntN(maxParts + 1) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	stopped := 0
	for trial := range 3000 {
		var stops []string
		for range 1 + rng.IntN(6) {
			if s := randText(5); s != "" {
				stops = append(stops, s)
			}
		}
		o, ref := &textOut{stops: newStopMatcher(stops)}, &naiveOut{stops: stops}
		for step := range 30 {
			piece := randText(3)
			got := o.addText(token{id: int32(step)}, piece)
			wantText, wantTokens := ref.add(piece)
			if got.text != wantText || len(got.tokens) != wantTokens || o.stopped != ref.stopped {
				t.Fatalf("trial %d step %d, stops %q, piece %q: released %q in %d tokens (stop %q), want %q in %d (stop %q)",
					trial, step, stops, piece, got.text, len(got.tokens), o.stopped, wantText, wantTokens, ref.stopped)
			}
			if o.stopped != "" {
				stopped++
				break
			}
			// Only tokens whose text may begin a stop string stay held.
			if len(o.held) > 0 && len(o.text)-o.heldLen[0] >= ref.partialStop() {
				t.Fatalf("trial %d step %d: held %q, of which only the last %d bytes may begin a stop", trial, step, o.text, ref.partialStop())
			}
		}
	}
	if stopped < 1000 {
		t.Fatalf("only %d trials stopped", stopped)
	}
}

// TestTextOutCases spells out what stop strings do to streamed output.
func TestTextOutCases(t *testing.T) {
	cases := []struct {
		name          string
		pieces, stops []string
		steps         []string // text released after each piece (and after finish, if no stop)
		stopped       string
	}{
		{"in the middle of a token", []string{"abc", "dXYe", "fg"}, []string{"XY"}, []string{"abc", "d"}, "XY"},
		{"across tokens", []string{"ab", "cX", "Yd"}, []string{"XY"}, []string{"ab", "", "c"}, "XY"},
		{"earliest start among those ending in one token", []string{"a", "bcde"}, []string{"cd", "bcde"}, []string{"a", ""}, "bcde"},
		{"the first to complete wins", []string{"ab", "c", "d"}, []string{"abcd", "bc"}, []string{"", "a"}, "bc"},
		{"a tie goes to the first listed", []string{"xabc"}, []string{"abc", "ab"}, []string{"x"}, "abc"},
		{"a tie goes to the first listed, reversed", []string{"xabc"}, []string{"ab", "abc"}, []string{"x"}, "ab"},
		{"only a possible prefix is held", []string{"xx", "ab", "zz", "a"}, []string{"abc"}, []string{"xx", "", "abzz", "", "a"}, ""},
		{"a prefix that stops being one is released", []string{"a", "b", "d"}, []string{"abc", "bb"}, []string{"", "", "abd", ""}, ""},
		{"no stop strings", []string{"abc", "d"}, nil, []string{"abc", "d", ""}, ""},
	}
	for _, c := range cases {
		o := &textOut{stops: newStopMatcher(c.stops)}
		var steps []string
		for i, p := range c.pieces {
			steps = append(steps, o.addText(token{id: int32(i)}, p).text)
			if o.stopped != "" {
				break
			}
		}
		if o.stopped == "" {
			steps = append(steps, o.finishText("").text)
		}
		if !slices.Equal(steps, c.steps) || o.stopped != c.stopped {
			t.Errorf("%s: released %q (stop %q), want %q (stop %q)", c.name, steps, o.stopped, c.steps, c.stopped)
		}
	}
}

// TestStopLimits checks the bounds on stop strings, at and past each limit.
func TestStopLimits(t *testing.T) {
	many := make([]string, maxStops)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	for _, c := range []struct {
		stops []string
		inMsg string
	}{
		{many, ""},
		{append(many, "x"), "limit is 16"},
		{[]string{strings.Repeat("é", maxStopBytes/2)}, ""},
		{[]string{"ok", strings.Repeat("x", maxStopBytes+1)}, "stop[1] is 257 bytes long, the limit is 256 bytes"},
	} {
		err := checkStops(c.stops)
		switch {
		case c.inMsg == "" && err != nil:
			t.Errorf("%d stops: %v", len(c.stops), err)
		case c.inMsg != "" && (err == nil || !strings.Contains(err.Error(), c.inMsg) || asAPIError(err).Status != 400):
			t.Errorf("%d stops: %v, want a 400 saying %q", len(c.stops), err, c.inMsg)
		}
	}
}

// BenchmarkStopMatching streams 4-byte tokens of "aaaa" against the worst
// stop strings allowed: maxStops strings of maxStopBytes bytes that all
// begin with a long run of "a", so that a long prefix is always pending.
// The naive reference rescans that prefix for every string and length at
// every token; the automaton steps once per byte.
func BenchmarkStopMatching(b *testing.B) {
	stops := make([]string, maxStops)
	for i := range stops {
		stops[i] = strings.Repeat("a", maxStopBytes-1-i) + string(rune('b'+i))
	}
	const tokens = 1000
	b.Run("automaton", func(b *testing.B) {
		for b.Loop() {
			o := &textOut{stops: newStopMatcher(stops)}
			for i := range tokens {
				o.addText(token{id: int32(i)}, "aaaa")
			}
		}
	})
	b.Run("naive", func(b *testing.B) {
		for b.Loop() {
			o := &naiveOut{stops: stops}
			for range tokens {
				o.add("aaaa")
			}
		}
	})
}
