package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// Pre-tokenizer patterns that have hand-written splitters. Any other Split
// pattern runs on the general regex engine.
const (
	// qwen2Pattern is used by Qwen2 and Qwen3.
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// qwen35Pattern is used by Qwen3.5 and Qwen3.6: letters include combining marks.
	qwen35Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// gpt2Pattern is what HF's ByteLevel pre-tokenizer splits with when use_regex is true.
	gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// splitter cuts a string into pieces that together cover it, in order, as
// HF's Split pre-tokenizer with the "Isolated" behaviour does: every match
// is a piece and so is every stretch between matches.
type splitter interface {
	appendPieces(dst []string, s string) []string
}

// preTokenizeStep is one stage of the pre-tokenizer, applied to every piece
// the previous stage produced.
type preTokenizeStep struct {
	prefixSpace bool     // ByteLevel add_prefix_space: prepend " " to a piece that lacks it
	split       splitter // nil keeps the piece whole
}

// preTokenizer runs its steps over a normalized text.
type preTokenizer []preTokenizeStep

// split returns the pre-tokens of s. The steps alternate between two
// buffers, which are passed in and handed back for the next call to reuse.
func (p preTokenizer) split(bufA, bufB []string, s string) (pieces, spare []string) {
	cur := append(bufA[:0], s)
	next := bufB
	for _, step := range p {
		next = next[:0]
		for _, piece := range cur {
			if step.prefixSpace && !strings.HasPrefix(piece, " ") {
				piece = " " + piece
			}
			if step.split == nil {
				next = append(next, piece)
			} else {
				next = step.split.appendPieces(next, piece)
			}
		}
		cur, next = next, cur
	}
	return cur, next
}

// regexSplitter is the general path, on a backtracking engine that has the
// lookahead these patterns use.
type regexSplitter struct{ re *regexp2.Regexp }

func newRegexSplitter(pattern string) (regexSplitter, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	return regexSplitter{re}, err
}

func (r regexSplitter) appendPieces(dst []string, s string) []string {
	matches, err := r.re.FindAllStringIndex(s, -1)
	if err != nil {
		// Only a match timeout fails, and no timeout is set.
		return append(dst, s)
	}
	prev := 0
	for _, m := range matches {
		if m[0] > prev {
			dst = append(dst, s[prev:m[0]])
		}
		if m[1] > m[0] {
			dst = append(dst, s[m[0]:m[1]])
		}
		prev = m[1]
	}
	if prev < len(s) {
		dst = append(dst, s[prev:])
	}
	return dst
}

// charClass is what the Qwen patterns distinguish about a character.
type charClass uint8

const (
	classOther   charClass = iota
	classLetter            // \p{L}
	classMark              // \p{M}
	classNumber            // \p{N}
	classSpace             // \s other than \r and \n
	classNewline           // \r or \n
)

var asciiClasses [utf8.RuneSelf]charClass

func init() {
	for r := range rune(utf8.RuneSelf) {
		asciiClasses[r] = classifyRune(r)
	}
}

func classifyRune(r rune) charClass {
	switch {
	case r == '\r' || r == '\n':
		return classNewline
	case unicode.IsLetter(r):
		return classLetter
	case unicode.IsMark(r):
		return classMark
	case unicode.IsNumber(r):
		return classNumber
	case unicode.IsSpace(r): // Unicode White_Space, which is what \s means in the HF engine
		return classSpace
	// HF's engine has Unicode 16.0 data, Go's unicode package 15.0.
	case unicode.Is(unicode16Letters, r):
		return classLetter
	case unicode.Is(unicode16Marks, r):
		return classMark
	case unicode.Is(unicode16Numbers, r):
		return classNumber
	}
	return classOther
}

// charAt decodes the character at byte i and classifies it.
func charAt(s string, i int) (r rune, size int, c charClass) {
	if b := s[i]; b < utf8.RuneSelf {
		return rune(b), 1, asciiClasses[b]
	}
	r, size = utf8.DecodeRuneInString(s[i:])
	return r, size, classifyRune(r)
}

// qwenSplitter is a hand-written matcher for qwen2Pattern and, with
// marksAreLetters, qwen35Pattern. It reproduces the backtracking engine's
// leftmost-first choice among the alternatives, tried in pattern order.
type qwenSplitter struct{ marksAreLetters bool }

func (q qwenSplitter) appendPieces(dst []string, s string) []string {
	for i := 0; i < len(s); {
		end := q.matchAt(s, i)
		dst = append(dst, s[i:end])
		i = end
	}
	return dst
}

func (q qwenSplitter) isLetter(c charClass) bool {
	return c == classLetter || (q.marksAreLetters && c == classMark)
}

// isOther is [^\s\p{L}\p{N}] (Qwen2) or [^\s\p{L}\p{M}\p{N}] (Qwen3.5).
func (q qwenSplitter) isOther(c charClass) bool {
	return c != classSpace && c != classNewline && c != classNumber && !q.isLetter(c)
}

// matchAt returns the end of the match starting at i. Every character starts
// a match of one of the alternatives, so the pattern never skips text.
func (q qwenSplitter) matchAt(s string, i int) int {
	r, size, c := charAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' {
		if n := contractionLen(s[i+1:]); n > 0 {
			return i + 1 + n
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+ : the optional prefix is tried first. It
	// excludes letters but not marks, so a Qwen3.5 mark may take either role.
	if c != classNewline && c != classLetter && c != classNumber {
		if end := q.letterRun(s, i+size); end > i+size {
			return end
		}
	}
	if q.isLetter(c) {
		return q.letterRun(s, i)
	}
	// \p{N}
	if c == classNumber {
		return i + size
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	start := i
	if r == ' ' {
		start += size
	}
	if start < len(s) {
		if _, n, c2 := charAt(s, start); q.isOther(c2) {
			end := start + n
			for end < len(s) {
				_, n, c3 := charAt(s, end)
				if !q.isOther(c3) {
					break
				}
				end += n
			}
			for end < len(s) && (s[end] == '\r' || s[end] == '\n') {
				end++
			}
			return end
		}
	}
	return whitespaceMatch(s, i)
}

// whitespaceMatch handles the last three alternatives, \s*[\r\n]+ then
// \s+(?!\S) then \s+, at a whitespace character.
func whitespaceMatch(s string, i int) int {
	end, afterNewline, lastStart, count := i, -1, i, 0
	for end < len(s) {
		_, n, c := charAt(s, end)
		if c != classSpace && c != classNewline {
			break
		}
		if c == classNewline {
			afterNewline = end + n
		}
		lastStart = end
		end += n
		count++
	}
	switch {
	case afterNewline >= 0: // \s* backtracks to the last line break
		return afterNewline
	case end == len(s) || count == 1: // the run ends the text, or \s+ takes the lone space
		return end
	default: // leave the last space to go with the word after it
		return lastStart
	}
}

// letterRun returns the end of the run of letters starting at i.
func (q qwenSplitter) letterRun(s string, i int) int {
	for i < len(s) {
		_, n, c := charAt(s, i)
		if !q.isLetter(c) {
			break
		}
		i += n
	}
	return i
}

// contractionLen matches s|t|re|ve|m|ll|d case-insensitively at the start of
// s. Case folding also maps U+017F (long s) to s.
func contractionLen(s string) int {
	first, n1 := foldedLetter(s)
	var second byte
	switch first {
	case 's', 't', 'm', 'd':
		return n1
	case 'r', 'v':
		second = 'e'
	case 'l':
		second = 'l'
	default:
		return 0
	}
	if next, n2 := foldedLetter(s[n1:]); next == second {
		return n1 + n2
	}
	return 0
}

func foldedLetter(s string) (byte, int) {
	if s == "" {
		return 0, 0
	}
	if b := s[0]; b < utf8.RuneSelf {
		return b | 0x20, 1 // lower-cases letters; other bytes match nothing in contractionLen
	}
	if strings.HasPrefix(s, "ſ") {
		return 's', len("ſ")
	}
	return 0, 0
}
