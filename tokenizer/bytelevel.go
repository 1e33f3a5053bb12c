package tokenizer

import "unicode/utf8"

// byteRunes is GPT-2's byte-to-character map used by byte-level BPE: printable
// Latin-1 bytes stand for themselves and the other 68 bytes are moved, in
// order, to U+0100 onwards, so that every byte has a visible vocabulary
// character ("Ġ" is the space byte).
var byteRunes [256]rune

// runeBytes inverts byteRunes for the ByteLevel decoder.
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

// byteLevelString maps raw bytes to their byte-level vocabulary spelling.
func byteLevelString(raw []byte) string {
	out := make([]byte, 0, 2*len(raw))
	for _, b := range raw {
		out = utf8.AppendRune(out, byteRunes[b])
	}
	return string(out)
}

// byteLevelDecode turns a vocabulary token back into the bytes it stands for,
// as HF's ByteLevel decoder does: a token made only of byte-level characters
// becomes those bytes, any other token (an added token such as "<|im_end|>"
// written with characters outside the map) stays as its own UTF-8.
func byteLevelDecode(token string) []byte {
	out := make([]byte, 0, len(token))
	for _, r := range token {
		b, ok := runeBytes[r]
		if !ok {
			return []byte(token)
		}
		out = append(out, b)
	}
	return out
}
