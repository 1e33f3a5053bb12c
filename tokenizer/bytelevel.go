package tokenizer

// byteRunes is GPT-2's byte-to-character map used by byte-level BPE: printable
// Latin-1 bytes stand for themselves and the other 68 bytes are moved, in
// order, to U+0100 onwards, so that every byte has a visible vocabulary
// character ("Ġ" is the space byte).
var byteRunes [256]rune

// runeBytes inverts byteRunes.
var runeBytes = map[rune]byte{}

func init() {
	next := rune(256)
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE
		if printable {
			byteRunes[b] = rune(b)
		} else {
			byteRunes[b] = next
			next++
		}
		runeBytes[byteRunes[b]] = byte(b)
	}
}

// byteLevelBytes returns the bytes a vocabulary token stands for, or false
// when it has a character outside the byte-level map. HF's ByteLevel decoder
// then keeps the token's own UTF-8 (added tokens such as "<|im_end|>" are
// spelled with printable ASCII, which maps to itself either way).
func byteLevelBytes(token string) ([]byte, bool) {
	out := make([]byte, 0, len(token))
	for _, r := range token {
		b, ok := runeBytes[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}
