package server

// The recursive-descent reading of the grammars that the incremental parser
// (grammar_parser.go) replaced: each call re-reads a reply from its start.
// It stays as the independent reference the parser is checked against.

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// refGrammar is a grammar the reference can read.
type refGrammar interface {
	parse(sc *scanner) error
}

var errIncomplete = errors.New("incomplete")

// scanner reads reply bytes for a grammar.
type scanner struct {
	b []byte
	i int
}

func (sc *scanner) atEnd() bool { return sc.i >= len(sc.b) }

// peek returns the next byte, or errIncomplete.
func (sc *scanner) peek() (byte, error) {
	if sc.atEnd() {
		return 0, errIncomplete
	}
	return sc.b[sc.i], nil
}

// literal consumes s: errIncomplete when the bytes end inside it.
func (sc *scanner) literal(s string) error {
	rest := sc.b[sc.i:]
	n := min(len(rest), len(s))
	if string(rest[:n]) != s[:n] {
		return fmt.Errorf("want %q", s)
	}
	sc.i += n
	if n < len(s) {
		return errIncomplete
	}
	return nil
}

// blank skips up to maxBlank bytes of JSON white space.
func (sc *scanner) blank() error {
	for n := 0; !sc.atEnd(); n++ {
		switch sc.b[sc.i] {
		case ' ', '\t', '\n', '\r':
			if n == maxBlank {
				return errors.New("too much white space")
			}
			sc.i++
		default:
			return nil
		}
	}
	return nil
}

// name reads up to the byte end, which it consumes; allowed (nil: any)
// bounds the name, and a partial one must begin an allowed name.
func (sc *scanner) name(end byte, allowed []string) (string, error) {
	start := sc.i
	for !sc.atEnd() {
		c := sc.b[sc.i]
		if c == end {
			name := string(sc.b[start:sc.i])
			sc.i++
			if allowed != nil && !slices.Contains(allowed, name) || name == "" {
				return "", fmt.Errorf("name %q not allowed", name)
			}
			return name, nil
		}
		if c == '\n' || c == '<' {
			return "", errors.New("bad name")
		}
		sc.i++
	}
	partial := string(sc.b[start:])
	if allowed == nil || slices.ContainsFunc(allowed, func(a string) bool { return strings.HasPrefix(a, partial) }) {
		return "", errIncomplete
	}
	return "", fmt.Errorf("no name starts %q", partial)
}

// refCheck says whether b is a valid prefix of g, and whether it is complete.
func refCheck(g grammar, b []byte) (viable, complete bool) {
	sc := &scanner{b: b}
	switch err := g.(refGrammar).parse(sc); {
	case err == errIncomplete:
		return true, false
	case err != nil:
		return false, false
	}
	return sc.atEnd(), sc.atEnd()
}

func (a afterThinking) parse(sc *scanner) error {
	i := bytes.Index(sc.b[sc.i:], []byte(thinkClose))
	if i < 0 {
		sc.i = len(sc.b)
		return errIncomplete
	}
	sc.i += i + len(thinkClose)
	if err := sc.blank(); err != nil {
		return err
	}
	return a.g.(refGrammar).parse(sc)
}

func (j jsonReply) parse(sc *scanner) error {
	if err := sc.blank(); err != nil {
		return err
	}
	return j.schema.parse(sc)
}

// parse reads one JSON value of the schema.
func (s *schema) parse(sc *scanner) error {
	if s != nil && s.enum != nil {
		return s.parseEnum(sc)
	}
	c, err := sc.peek()
	if err != nil {
		return err
	}
	switch {
	case c == '{' && s.allows("object"):
		return s.parseObject(sc)
	case c == '[' && s.allows("array"):
		return s.parseArray(sc)
	case c == '"' && s.allows("string"):
		_, err := parseString(sc)
		return err
	case c == 't' && s.allows("boolean"):
		return sc.literal("true")
	case c == 'f' && s.allows("boolean"):
		return sc.literal("false")
	case c == 'n' && s.allows("null"):
		return sc.literal("null")
	case (c == '-' || c >= '0' && c <= '9') && s.allows("integer"):
		return parseNumber(sc, !s.allows("number"))
	}
	return fmt.Errorf("unexpected %q", c)
}

// parseEnum reads one of the allowed values, as written in the schema:
// the whole rest when it is one; else nothing while the rest may still
// become one (one value can begin another: 1 and 12); else the longest
// value the rest begins with.
func (s *schema) parseEnum(sc *scanner) error {
	rest := string(sc.b[sc.i:])
	if slices.Contains(s.enum, rest) {
		sc.i = len(sc.b)
		return nil
	}
	if slices.ContainsFunc(s.enum, func(v string) bool { return strings.HasPrefix(v, rest) }) {
		sc.i = len(sc.b)
		return errIncomplete
	}
	longest := ""
	for _, v := range s.enum {
		if strings.HasPrefix(rest, v) && len(v) > len(longest) {
			longest = v
		}
	}
	if longest == "" {
		return errors.New("not an allowed value")
	}
	sc.i += len(longest)
	return nil
}

func (s *schema) parseObject(sc *scanner) error {
	sc.i++ // {
	var seen []string
	member := func() error {
		if err := sc.blank(); err != nil {
			return err
		}
		var allowed []string
		if s != nil && s.closed {
			allowed = slices.DeleteFunc(slices.Clone(s.keys), func(k string) bool { return slices.Contains(seen, k) })
		}
		key, err := parseKey(sc, allowed)
		if err != nil {
			return err
		}
		if slices.Contains(seen, key) {
			return fmt.Errorf("duplicate key %q", key)
		}
		seen = append(seen, key)
		var value *schema
		if s != nil {
			if sub, ok := s.properties[key]; ok {
				value = sub
			} else {
				value = s.additional
			}
		}
		if err := sc.blank(); err != nil {
			return err
		}
		if err := sc.literal(":"); err != nil {
			return err
		}
		if err := sc.blank(); err != nil {
			return err
		}
		if err := value.parse(sc); err != nil {
			return err
		}
		return sc.blank()
	}
	required := func() error {
		if s != nil {
			for _, key := range s.required {
				if !slices.Contains(seen, key) {
					return fmt.Errorf("missing %q", key)
				}
			}
		}
		return nil
	}
	more := func() bool { return s == nil || !s.closed || len(seen) < len(s.keys) }
	return sequence(sc, '}', member, required, more)
}

func (s *schema) parseArray(sc *scanner) error {
	sc.i++ // [
	var items *schema
	if s != nil {
		items = s.items
	}
	item := func() error {
		if err := sc.blank(); err != nil {
			return err
		}
		if err := items.parse(sc); err != nil {
			return err
		}
		return sc.blank()
	}
	return sequence(sc, ']', item, func() error { return nil }, func() bool { return true })
}

// sequence reads an object's members or an array's items, after the
// opening byte: items separated by commas, up to the closing byte. done
// checks the whole before it closes; more says whether an item may follow.
func sequence(sc *scanner, closing byte, item, done func() error, more func() bool) error {
	if err := sc.blank(); err != nil {
		return err
	}
	for first := true; ; first = false {
		c, err := sc.peek()
		if err != nil {
			return err
		}
		switch {
		case c == closing:
			if err := done(); err != nil {
				return err
			}
			sc.i++
			return nil
		case c == ',' && !first:
			sc.i++
			if !more() {
				return errors.New("nothing may follow")
			}
		case !first:
			return fmt.Errorf("unexpected %q", c)
		}
		if err := item(); err != nil {
			return err
		}
	}
}

// parseKey reads an object key; allowed (nil: any) bounds it.
func parseKey(sc *scanner, allowed []string) (string, error) {
	start := sc.i
	raw, err := parseString(sc)
	if allowed == nil {
		return raw, err
	}
	if err == errIncomplete {
		partial := ""
		if len(sc.b) > start+1 {
			partial = string(sc.b[start+1:])
		}
		if slices.ContainsFunc(allowed, func(k string) bool { return strings.HasPrefix(k, partial) }) {
			return "", errIncomplete
		}
		return "", fmt.Errorf("no allowed key starts %q", partial)
	}
	if err == nil && !slices.Contains(allowed, raw) {
		return "", fmt.Errorf("key %q not allowed", raw)
	}
	return raw, err
}

// parseString reads a JSON string and returns it as written (escapes kept).
func parseString(sc *scanner) (string, error) {
	if err := sc.literal(`"`); err != nil {
		return "", err
	}
	start := sc.i
	for !sc.atEnd() {
		c := sc.b[sc.i]
		switch {
		case c == '"':
			sc.i++
			return string(sc.b[start : sc.i-1]), nil
		case c < 0x20:
			return "", errors.New("control character in a string")
		case c == '\\':
			sc.i++
			e, err := sc.peek()
			if err != nil {
				return "", err
			}
			sc.i++
			switch {
			case strings.IndexByte(`"\/bfnrt`, e) >= 0:
			case e == 'u':
				for range 4 {
					h, err := sc.peek()
					if err != nil {
						return "", err
					}
					if !strings.ContainsRune("0123456789abcdefABCDEF", rune(h)) {
						return "", errors.New("bad \\u escape")
					}
					sc.i++
				}
			default:
				return "", errors.New("bad escape")
			}
		default:
			sc.i++
		}
	}
	return "", errIncomplete
}

// parseNumber reads a JSON number (integer: no fraction or exponent). A
// number that reaches the end may go on, so it is incomplete.
func parseNumber(sc *scanner, integer bool) error {
	digits := func() (int, error) {
		n := 0
		for !sc.atEnd() && sc.b[sc.i] >= '0' && sc.b[sc.i] <= '9' {
			sc.i++
			n++
		}
		if sc.atEnd() {
			return n, errIncomplete
		}
		return n, nil
	}
	if sc.b[sc.i] == '-' {
		sc.i++
	}
	c, err := sc.peek()
	if err != nil {
		return err
	}
	if c == '0' {
		sc.i++
		if sc.atEnd() {
			return errIncomplete
		}
	} else if n, err := digits(); err != nil || n == 0 {
		if err == nil {
			err = errors.New("want a digit")
		}
		return err
	}
	if integer {
		return nil
	}
	if sc.b[sc.i] == '.' {
		sc.i++
		if n, err := digits(); err != nil || n == 0 {
			if err == nil {
				err = errors.New("want a digit")
			}
			return err
		}
	}
	if c := sc.b[sc.i]; c == 'e' || c == 'E' {
		sc.i++
		if c, err := sc.peek(); err != nil {
			return err
		} else if c == '+' || c == '-' {
			sc.i++
		}
		if n, err := digits(); err != nil || n == 0 {
			if err == nil {
				err = errors.New("want a digit")
			}
			return err
		}
	}
	return nil
}

func (g toolCallsGrammar) parse(sc *scanner) error {
	for calls := 0; ; calls++ {
		if err := sc.blank(); err != nil {
			return err
		}
		if calls > 0 && (sc.atEnd() || !g.parallel) {
			return nil
		}
		if err := g.call(sc); err != nil {
			return err
		}
	}
}

// call reads <tool_call>\n<function=NAME>\n PARAMS </function>\n</tool_call>.
func (g toolCallsGrammar) call(sc *scanner) error {
	if err := sc.literal(toolCallOpen + "\n" + functionOpen); err != nil {
		return err
	}
	names := make([]string, len(g.functions))
	for i, f := range g.functions {
		names[i] = f.name
	}
	name, err := sc.name('>', names)
	if err != nil {
		return err
	}
	spec := g.functions[slices.Index(names, name)]
	if err := sc.literal("\n"); err != nil {
		return err
	}
	var seen []string
	for {
		if err := sc.literal("<"); err != nil {
			return err
		}
		c, err := sc.peek()
		if err != nil {
			return err
		}
		if c == '/' {
			for _, r := range spec.required {
				if !slices.Contains(seen, r) {
					return errors.New("a required parameter is missing")
				}
			}
			return sc.literal("/function>\n" + toolCallClose)
		}
		if err := sc.literal(paramOpen[1:]); err != nil {
			return err
		}
		var allowed []string
		if spec.keys != nil {
			allowed = slices.DeleteFunc(slices.Clone(spec.keys), func(k string) bool { return slices.Contains(seen, k) })
		}
		param, err := sc.name('>', allowed)
		if err != nil {
			return err
		}
		seen = append(seen, param)
		if err := sc.literal("\n"); err != nil {
			return err
		}
		if err := paramValue(sc, spec.params[param]); err != nil {
			return err
		}
		if err := sc.literal("\n" + paramClose + "\n"); err != nil {
			return err
		}
	}
}

// paramValue reads a parameter's value: JSON of its schema, or (nil) text
// up to the closing tag.
func paramValue(sc *scanner, s *schema) error {
	if s != nil {
		return s.parse(sc)
	}
	end := []byte("\n" + paramClose)
	for !sc.atEnd() {
		rest := sc.b[sc.i:]
		if len(rest) >= len(end) && string(rest[:len(end)]) == string(end) {
			return nil
		}
		if len(rest) < len(end) && string(end[:len(rest)]) == string(rest) {
			return nil // the closing tag, begun
		}
		sc.i++
	}
	return errIncomplete
}
