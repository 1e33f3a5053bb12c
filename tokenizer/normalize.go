package tokenizer

import (
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
	"golang.org/x/text/unicode/rangetable"
)

// combiningGraphemeJoiner is what x/text's normalization inserts after 30
// combining marks in a row (the Unicode Stream-Safe Text Format).
const combiningGraphemeJoiner = "\u034f"

// normalizeText applies form as HF does. x/text does the work except in two
// cases where HF differs, which take normalizeUnbounded (exact and slow):
//   - HF has no stream-safe limit on runs of combining marks;
//   - HF's normalizers use Unicode 9.0 data, so characters added later
//     (such as U+1AC1) neither decompose, reorder nor compose there.
func normalizeText(form norm.Form, s string) string {
	out := form.String(s)
	insertedJoiner := strings.Contains(out, combiningGraphemeJoiner) &&
		strings.Count(out, combiningGraphemeJoiner) != strings.Count(s, combiningGraphemeJoiner)
	if insertedJoiner || hasLateNormalizingChar(s) {
		return normalizeUnbounded(form, s)
	}
	return out
}

// lateNormalizing holds the characters assigned after Unicode 9.0 that
// x/text would decompose, reorder or compose. blocks marks each 256-code-point
// block that holds one, for a quick scan.
type lateNormalizing struct {
	chars  map[rune]bool
	blocks [(unicode.MaxRune + 1) >> 8]bool
}

var lateNormalizingChars = sync.OnceValue(func() *lateNormalizing {
	late := &lateNormalizing{chars: map[rune]bool{}}
	unicode9 := rangetable.Assigned("9.0.0")
	rangetable.Visit(rangetable.Assigned("15.0.0"), func(r rune) {
		if unicode.Is(unicode9, r) {
			return
		}
		s := string(r)
		if norm.NFKD.PropertiesString(s).Decomposition() != nil || norm.NFD.PropertiesString(s).CCC() != 0 ||
			!norm.NFC.PropertiesString(s).BoundaryBefore() {
			late.chars[r] = true
			late.blocks[r>>8] = true
		}
	})
	return late
})

func hasLateNormalizingChar(s string) bool {
	late := lateNormalizingChars()
	for _, r := range s {
		if late.blocks[r>>8] && late.chars[r] {
			return true
		}
	}
	return false
}

func isLateNormalizing(r rune) bool {
	late := lateNormalizingChars()
	return late.blocks[r>>8] && late.chars[r]
}

// normalizeUnbounded is the textbook algorithm of UAX #15 (full
// decomposition, canonical ordering, canonical composition) with no limit
// on the length of a run of combining marks, and with characters added
// after Unicode 9.0 left alone. x/text supplies the character data.
func normalizeUnbounded(form norm.Form, s string) string {
	decomposer := norm.NFD
	if form == norm.NFKC || form == norm.NFKD {
		decomposer = norm.NFKD
	}
	var runes []rune
	for _, r := range s {
		runes = appendDecomposed(runes, decomposer, r)
	}
	for i := 0; i < len(runes); {
		j := i
		for j < len(runes) && combiningClass(runes[j]) != 0 {
			j++
		}
		slices.SortStableFunc(runes[i:j], func(a, b rune) int { return int(combiningClass(a)) - int(combiningClass(b)) })
		i = j + 1
	}
	if form == norm.NFC || form == norm.NFKC {
		runes = composeCanonical(runes)
	}
	return string(runes)
}

// Hangul syllable arithmetic (Unicode §3.12).
const (
	hangulBase   = 0xAC00
	hangulLBase  = 0x1100
	hangulVBase  = 0x1161
	hangulTBase  = 0x11A7
	hangulTCount = 28
	hangulNCount = 21 * hangulTCount
	hangulCount  = 19 * hangulNCount
)

func appendDecomposed(dst []rune, decomposer norm.Form, r rune) []rune {
	if r >= hangulBase && r < hangulBase+hangulCount {
		i := r - hangulBase
		dst = append(dst, hangulLBase+i/hangulNCount, hangulVBase+(i%hangulNCount)/hangulTCount)
		if t := i % hangulTCount; t != 0 {
			dst = append(dst, hangulTBase+t)
		}
		return dst
	}
	d := decomposer.PropertiesString(string(r)).Decomposition()
	if d == nil || isLateNormalizing(r) {
		return append(dst, r)
	}
	for len(d) > 0 {
		part, size := utf8.DecodeRune(d)
		dst = appendDecomposed(dst, decomposer, part)
		d = d[size:]
	}
	return dst
}

func combiningClass(r rune) uint8 {
	if isLateNormalizing(r) {
		return 0
	}
	return norm.NFD.PropertiesString(string(r)).CCC()
}

// composeCanonical combines each starter with the following characters that
// are not blocked from it and form a primary composite with it.
func composeCanonical(runes []rune) []rune {
	if len(runes) == 0 {
		return runes
	}
	out := runes[:1]
	starter := 0
	lastClass := combiningClass(runes[0])
	if lastClass != 0 {
		lastClass = 255 // a leading mark has no starter to combine with
	}
	for _, r := range runes[1:] {
		class := combiningClass(r)
		if lastClass < class || lastClass == 0 {
			if c, ok := composePair(out[starter], r); ok {
				out[starter] = c
				continue
			}
		}
		if class == 0 {
			starter = len(out)
		}
		lastClass = class
		out = append(out, r)
	}
	return out
}

// composePair reports the primary composite of a and b, if there is one.
func composePair(a, b rune) (rune, bool) {
	if isLateNormalizing(a) || isLateNormalizing(b) {
		return 0, false
	}
	pair := string([]rune{a, b})
	composed := norm.NFC.String(pair)
	r, size := utf8.DecodeRuneInString(composed)
	return r, size == len(composed) && composed != pair
}
