package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
)

// A grammar decides whether reply bytes can still become a valid reply:
// its root frame starts an incremental parser (grammar_parser.go) that
// takes the reply byte by byte. Grammars drive constrained decoding
// (response_format, tool_choice).
type grammar interface {
	root() frame
}

// maxBlank bounds each run of white space between a grammar's tokens
// (JSON's structure, before and between tool calls), as xgrammar's
// max_whitespace_cnt does, so that a weak model cannot pad a constrained
// reply until max_tokens: past it only the next token may come. Eight
// leaves room for a newline and seven spaces of indentation (pretty-printed
// JSON two spaces a level, three levels deep). Text inside JSON strings and
// free-text tool parameters is the reply's content and is not bounded.
const maxBlank = 8

// check says whether b is a valid prefix of g, and whether it is complete.
func check(g grammar, b []byte) (viable, complete bool) {
	p := newParser(g)
	return p.feed(b), p.complete()
}

// afterThinking is a reply that reasons first: any text up to </think>,
// then g.
type afterThinking struct{ g grammar }

// jsonReply is a reply that is one JSON value of a schema.
type jsonReply struct{ schema *schema }

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
