package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// A grammar decides whether reply bytes can still become a valid reply: it
// parses one instance from a scanner, returning errIncomplete when the bytes
// end first (a valid prefix) and another error when they cannot be one.
// Grammars drive constrained decoding (response_format, tool_choice).
type grammar interface {
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

// maxBlank bounds white space between tokens of a grammar, so that a
// constrained model cannot pad a reply forever.
const maxBlank = 16

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

// check says whether b is a valid prefix of g, and whether it is complete.
func check(g grammar, b []byte) (viable, complete bool) {
	sc := &scanner{b: b}
	switch err := g.parse(sc); {
	case err == errIncomplete:
		return true, false
	case err != nil:
		return false, false
	}
	return sc.atEnd(), sc.atEnd()
}

// afterThinking is a reply that reasons first: any text up to </think>,
// then g.
type afterThinking struct{ g grammar }

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
	return a.g.parse(sc)
}

// jsonReply is a reply that is one JSON value of a schema.
type jsonReply struct{ schema *schema }

func (j jsonReply) parse(sc *scanner) error {
	if err := sc.blank(); err != nil {
		return err
	}
	return j.schema.parse(sc)
}

// schema is the part of JSON Schema constrained decoding supports. A nil
// *schema accepts any JSON value.
type schema struct {
	types      []string           // allowed JSON types; empty: any
	properties map[string]*schema // object members by name
	keys       []string           // the properties' names, sorted
	required   []string
	additional *schema // members beyond properties; nil with closed: none
	closed     bool
	items      *schema
	enum       []string // allowed values, as compact JSON
}

// schemaAnnotations are keywords that do not constrain values.
var schemaAnnotations = map[string]bool{"title": true, "description": true, "default": true, "examples": true,
	"$schema": true, "$id": true, "$comment": true, "strict": true}

// compileSchema reads a JSON schema; a keyword it cannot enforce is an
// error naming it and where it is.
func compileSchema(raw json.RawMessage, at string) (*schema, error) {
	var kw map[string]json.RawMessage
	if err := json.Unmarshal(raw, &kw); err != nil {
		var b bool
		if json.Unmarshal(raw, &b) == nil && b {
			return nil, nil // true: anything
		}
		return nil, fmt.Errorf("%s: want a schema object", at)
	}
	s := &schema{}
	names := make([]string, 0, len(kw))
	for name := range kw {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		v := kw[name]
		var err error
		switch name {
		case "type":
			var one string
			if json.Unmarshal(v, &one) == nil {
				s.types = []string{one}
			} else {
				err = json.Unmarshal(v, &s.types)
			}
			for _, t := range s.types {
				if !slices.Contains([]string{"object", "array", "string", "number", "integer", "boolean", "null"}, t) {
					err = fmt.Errorf("unknown type %q", t)
				}
			}
		case "properties":
			var props map[string]json.RawMessage
			if err = json.Unmarshal(v, &props); err == nil {
				s.properties = map[string]*schema{}
				for key, sub := range props {
					if s.properties[key], err = compileSchema(sub, at+".properties."+key); err != nil {
						return nil, err
					}
					s.keys = append(s.keys, key)
				}
				sort.Strings(s.keys)
			}
		case "required":
			err = json.Unmarshal(v, &s.required)
		case "additionalProperties":
			var allowed bool
			if json.Unmarshal(v, &allowed) == nil {
				s.closed = !allowed
			} else {
				s.additional, err = compileSchema(v, at+".additionalProperties")
				s.closed = false
				if err != nil {
					return nil, err
				}
			}
		case "items":
			if s.items, err = compileSchema(v, at+".items"); err != nil {
				return nil, err
			}
		case "enum", "const":
			var values []json.RawMessage
			if name == "const" {
				values = []json.RawMessage{v}
			} else if err = json.Unmarshal(v, &values); err == nil && len(values) == 0 {
				err = errors.New("empty")
			}
			for _, value := range values {
				var compact bytes.Buffer
				if err = json.Compact(&compact, value); err != nil {
					break
				}
				s.enum = append(s.enum, compact.String())
			}
		default:
			if !schemaAnnotations[name] {
				return nil, &unsupportedSchema{keyword: name, at: at}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %v", at, name, err)
		}
	}
	for _, key := range s.required {
		if s.properties[key] == nil && s.closed {
			return nil, fmt.Errorf("%s.required: %q is not among the properties", at, key)
		}
	}
	return s, nil
}

// unsupportedSchema is a JSON schema keyword constrained decoding cannot enforce.
type unsupportedSchema struct{ keyword, at string }

func (e *unsupportedSchema) Error() string {
	return fmt.Sprintf("the JSON schema keyword %q (at %s) is not supported", e.keyword, e.at)
}

func (s *schema) allows(t string) bool {
	return s == nil || len(s.types) == 0 || slices.Contains(s.types, t) || t == "integer" && slices.Contains(s.types, "number")
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

// parseEnum reads one of the allowed values, as written in the schema.
func (s *schema) parseEnum(sc *scanner) error {
	rest := sc.b[sc.i:]
	for _, v := range s.enum {
		if bytes.HasPrefix(rest, []byte(v)) {
			sc.i += len(v)
			return nil
		}
	}
	for _, v := range s.enum {
		if len(rest) < len(v) && strings.HasPrefix(v, string(rest)) {
			sc.i = len(sc.b)
			return errIncomplete
		}
	}
	return errors.New("not an allowed value")
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
