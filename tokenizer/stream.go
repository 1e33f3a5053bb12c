package tokenizer

// StreamDecoder turns ids into text as they arrive, for streaming output:
// it returns text only up to a complete UTF-8 character, holding back the
// start of a character whose bytes continue in a later token. Everything it
// returns, Flush included, concatenates to Decode of all the ids.
type StreamDecoder struct {
	tok         *Tokenizer
	skipSpecial bool
	pending     []byte // bytes of an incomplete character
}

// NewStreamDecoder starts a stream; skipSpecial leaves out special tokens.
func (t *Tokenizer) NewStreamDecoder(skipSpecial bool) *StreamDecoder {
	return &StreamDecoder{tok: t, skipSpecial: skipSpecial}
}

// Next adds one id and returns the text it completes, often "" in the middle
// of a character. An id outside the vocabulary is an error and changes nothing.
func (d *StreamDecoder) Next(id int32) (string, error) {
	b, keep, err := d.tok.tokenBytes(id, d.skipSpecial)
	if err != nil || !keep {
		return "", err
	}
	d.pending = append(d.pending, b...)
	return d.emit(false), nil
}

// Flush returns the held-back bytes (an unfinished character becomes
// U+FFFD, as Decode writes it) and leaves the decoder empty.
func (d *StreamDecoder) Flush() string {
	return d.emit(true)
}

func (d *StreamDecoder) emit(final bool) string {
	text, used := appendLossy(nil, d.pending, final)
	d.pending = append(d.pending[:0], d.pending[used:]...)
	return string(text)
}
