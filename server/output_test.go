package server

import (
	"math/rand/v2"
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
