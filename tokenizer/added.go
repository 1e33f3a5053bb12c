package tokenizer

import (
	"slices"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// addedMatcher finds added tokens in text the way HF's AddedVocabulary does:
// leftmost-longest, non-overlapping matches, then the single_word, lstrip
// and rstrip rules, and special tokens ignored when they are to be read as
// plain text.
type addedMatcher struct {
	patterns []addedPattern
	byFirst  [256][]int // indexes into patterns by first byte, longest first
}

type addedPattern struct {
	text  string // the content, normalized for normalized tokens
	token *addedToken
}

// segment is a piece of text, or an added token when id >= 0.
type segment struct {
	text string
	id   int32
}

func newAddedMatcher(patterns []addedPattern) addedMatcher {
	var m addedMatcher
	m.patterns = patterns
	for i, p := range patterns {
		if p.text != "" {
			m.byFirst[p.text[0]] = append(m.byFirst[p.text[0]], i)
		}
	}
	for _, idx := range m.byFirst {
		slices.SortStableFunc(idx, func(a, b int) int { return len(patterns[b].text) - len(patterns[a].text) })
	}
	return m
}

// find returns the leftmost-longest match at or after from, or ok=false.
func (m *addedMatcher) find(s string, from int) (start, end int, p *addedPattern, ok bool) {
	for i := from; i < len(s); i++ {
		for _, k := range m.byFirst[s[i]] {
			if text := m.patterns[k].text; len(s)-i >= len(text) && s[i:i+len(text)] == text {
				return i, i + len(text), &m.patterns[k], true
			}
		}
	}
	return 0, 0, nil, false
}

// appendSegments splits s into text and added-token segments. With
// parseSpecial false, tokens marked special are not recognised (HF's
// split_special_tokens), but they still hide any token inside them.
func (m *addedMatcher) appendSegments(dst []segment, s string, parseSpecial bool) []segment {
	done := 0 // s[:done] is already in dst
	for pos := 0; ; {
		start, end, p, ok := m.find(s, pos)
		if !ok {
			break
		}
		pos = end
		tok := p.token
		if tok.Special && !parseSpecial {
			continue
		}
		if tok.SingleWord && (endsWithWordChar(s[:start]) || startsWithWordChar(s[end:])) {
			continue
		}
		if tok.LStrip {
			start = max(start-trailingSpaceLen(s[:start]), done)
		}
		if tok.RStrip {
			end += leadingSpaceLen(s[end:])
		}
		if start > done {
			dst = append(dst, segment{s[done:start], -1})
		}
		dst = append(dst, segment{s[start:end], tok.ID})
		done = end
	}
	if done < len(s) {
		dst = append(dst, segment{s[done:], -1})
	}
	return dst
}

// isWordChar is \w of the HF engine: alphabetic, marks, decimal digits,
// connector punctuation and join controls.
func isWordChar(r rune) bool {
	return unicode.In(r, unicode.L, unicode.Nl, unicode.Other_Alphabetic, unicode.M, unicode.Nd, unicode.Pc, unicode.Join_Control)
}

func endsWithWordChar(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWordChar(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}

func trailingSpaceLen(s string) int {
	n := 0
	for len(s) > n {
		r, size := utf8.DecodeLastRuneInString(s[:len(s)-n])
		if !unicode.IsSpace(r) {
			break
		}
		n += size
	}
	return n
}

func leadingSpaceLen(s string) int {
	n := 0
	for n < len(s) {
		r, size := utf8.DecodeRuneInString(s[n:])
		if !unicode.IsSpace(r) {
			break
		}
		n += size
	}
	return n
}
