package tokenizer

import "unicode/utf8"

// appendLossy appends src to dst as valid UTF-8, replacing every invalid
// sequence with one U+FFFD the way Rust's String::from_utf8_lossy does (one
// replacement per maximal subpart of an ill-formed sequence), which is what
// HF's decoders produce. Unless final, a trailing sequence that is
// incomplete but could still become valid is left out; consumed says how
// many bytes of src were used.
func appendLossy(dst, src []byte, final bool) (out []byte, consumed int) {
	for i := 0; i < len(src); {
		r, size := utf8.DecodeRune(src[i:])
		if r != utf8.RuneError || size > 1 {
			dst = append(dst, src[i:i+size]...)
			i += size
			continue
		}
		n, complete := invalidPrefix(src[i:])
		if !complete && !final {
			return dst, i
		}
		dst = utf8.AppendRune(dst, utf8.RuneError)
		i += n
	}
	return dst, len(src)
}

// invalidPrefix measures the ill-formed sequence at the start of s: the
// longest prefix of a well-formed sequence (at least one byte). It reports
// false when that prefix runs to the end of s, so more bytes could still
// complete it.
func invalidPrefix(s []byte) (int, bool) {
	lo, hi := byte(0x80), byte(0xBF) // the range of the second byte
	var need int                     // continuation bytes after the lead byte
	switch b := s[0]; {
	case b >= 0xC2 && b <= 0xDF:
		need = 1
	case b == 0xE0:
		need, lo = 2, 0xA0
	case b >= 0xE1 && b <= 0xEC, b == 0xEE, b == 0xEF:
		need = 2
	case b == 0xED:
		need, hi = 2, 0x9F
	case b == 0xF0:
		need, lo = 3, 0x90
	case b >= 0xF1 && b <= 0xF3:
		need = 3
	case b == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1, true
	}
	for n := 1; n <= need; n++ {
		if n == len(s) {
			return n, false
		}
		if s[n] < lo || s[n] > hi {
			return n, true
		}
		lo, hi = 0x80, 0xBF
	}
	return need + 1, true // well-formed: callers pass only ill-formed sequences
}
