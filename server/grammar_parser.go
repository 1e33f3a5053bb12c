package server

import (
	"slices"
	"strings"
)

// parser is a grammar's incremental parser: a stack of frames, each the
// state of one construct being read, fed one reply byte at a time. Frames
// are plain values whose slices and strings are never written in place, so
// copying the stack (forkInto) copies the parser: constrained decoding
// parses the committed reply once per step, then tries each vocabulary
// token's bytes on a copy.
type parser struct {
	stack []frame
	ok    bool // false once a byte could not be taken
}

// newParser starts a parser at the beginning of a reply of g.
func newParser(g grammar) *parser { return &parser{stack: []frame{g.root()}, ok: true} }

// forkInto makes dst a copy of p, reusing dst's memory.
func (p *parser) forkInto(dst *parser) {
	dst.stack = append(dst.stack[:0], p.stack...)
	dst.ok = p.ok
}

// feed offers the bytes in order and says whether the reply is still viable.
func (p *parser) feed(b []byte) bool {
	for _, c := range b {
		if !p.ok {
			return false
		}
		p.byte(c)
	}
	return p.ok
}

// complete says whether the reply fed so far is a whole one.
func (p *parser) complete() bool {
	if !p.ok {
		return false
	}
	for i := range p.stack {
		if !p.stack[i].acceptsEnd() {
			return false
		}
	}
	return true
}

// action is what a frame did with a byte.
type action uint8

const (
	take    action = iota // consumed it
	takeEnd               // consumed it and is finished
	passEnd               // is finished; the byte goes to its parent
	again                 // pushed a child or became another frame: the byte goes to the top
	reject                // the byte cannot come here
)

func (p *parser) byte(c byte) {
	for {
		if len(p.stack) == 0 { // the reply is complete: nothing may follow
			p.ok = false
			return
		}
		switch p.stack[len(p.stack)-1].step(p, c) {
		case take:
			return
		case takeEnd:
			p.finishTop()
			return
		case passEnd:
			if p.finishTop(); !p.ok {
				return
			}
		case again:
		case reject:
			p.ok = false
			return
		}
	}
}

// finishTop pops the finished top frame and tells its parent, which may
// then be finished too.
func (p *parser) finishTop() {
	for len(p.stack) > 0 {
		child := p.stack[len(p.stack)-1]
		p.stack = p.stack[:len(p.stack)-1]
		if len(p.stack) == 0 {
			return
		}
		ok, finished := p.stack[len(p.stack)-1].childDone(&child)
		if !ok {
			p.ok = false
			return
		}
		if !finished {
			return
		}
	}
}

func (p *parser) push(f frame) action {
	p.stack = append(p.stack, f)
	return again
}

// frameKind is the construct a frame reads.
type frameKind uint8

const (
	fLiteral frameKind = iota // text, from byte n
	fBlank                    // up to maxBlank bytes of white space; n counts them
	fName                     // a name up to the byte delim, one of names (nil: any); text holds it
	fUntil                    // any bytes up to and including text, whose first byte occurs once in it; n matched
	fValue                    // one JSON value of s (becomes the frame of its type)
	fEnum                     // one of s.enum; text holds the bytes read
	fString                   // a JSON string; n: 0 before the quote, 1 inside, 2 after \, 3–6 in \uXXXX
	fKey                      // fString for an object key: text keeps it, one of names (nil: any)
	fNumber                   // n: the state of parseNumber's steps below; integer: no fraction or exponent
	fObject                   // s's members (pc, seen, first)
	fArray                    // s.items, comma separated (pc, first)
	fJSON                     // jsonReply: white space, then one value of s, then the end
	fThink                    // afterThinking: anything up to </think>, white space, then inner
	fCalls                    // toolCallsGrammar: calls (n of them so far)
	fCall                     // one qwen3_coder call of tools' functions
)

// frame is one construct being read. Fields are used as each kind says.
type frame struct {
	kind     frameKind
	pc       int // the next step of a construct with parts
	n        int
	delim    byte
	first    bool
	integer  bool
	text     string
	names    []string // nil: any
	seen     []string // object keys or call parameters read so far
	s, value *schema  // the frame's schema; the current member's or parameter's
	inner    grammar
	tools    *toolChoice
	spec     *toolSpec
}

func literalFrame(s string) frame { return frame{kind: fLiteral, text: s} }
func blankFrame() frame           { return frame{kind: fBlank} }
func valueFrame(s *schema) frame  { return frame{kind: fValue, s: s} }

// root frames of the grammars.
func (j jsonReply) root() frame        { return frame{kind: fJSON, s: j.schema} }
func (a afterThinking) root() frame    { return frame{kind: fThink, inner: a.g} }
func (g toolCallsGrammar) root() frame { tc := toolChoice(g); return frame{kind: fCalls, tools: &tc} }
func isBlank(c byte) bool              { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
func isDigit(c byte) bool              { return c >= '0' && c <= '9' }
func withPrefix(names []string, p string) bool {
	return names == nil || slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, p) })
}

// appended is seen plus one name, in a new array (forks share the old one).
func appended(seen []string, name string) []string { return append(seen[:len(seen):len(seen)], name) }

// acceptsEnd says whether the reply may end here, once the frames above
// this one (its pending child) are finished.
func (f *frame) acceptsEnd() bool {
	switch f.kind {
	case fBlank:
		return true
	case fEnum:
		return slices.Contains(f.s.enum, f.text)
	case fJSON:
		return f.pc == 2
	case fThink:
		return f.pc == 3
	case fCalls:
		return f.n > 0 && f.pc != 2
	}
	return false
}

// childDone takes the result of the child that just finished: whether it
// is acceptable, and whether this frame is then finished too.
func (f *frame) childDone(child *frame) (ok, finished bool) {
	switch f.kind {
	case fObject:
		if f.pc == 5 { // the key
			if slices.Contains(f.seen, child.text) {
				return false, false
			}
			f.seen = appended(f.seen, child.text)
			f.value = f.s.member(child.text)
		}
	case fJSON:
		return true, f.pc == 2
	case fThink:
		return true, f.pc == 3
	case fCalls:
		if f.pc == 2 {
			f.n++
			f.pc = 0
		}
	case fCall:
		switch f.pc {
		case 2: // the function's name
			i := slices.IndexFunc(f.tools.functions, func(s toolSpec) bool { return s.name == child.text })
			f.spec = &f.tools.functions[i]
		case 5: // "<parameter=": some parameter must be left to name
			if names := f.spec.unseen(f.seen); names != nil && len(names) == 0 {
				return false, false
			}
		case 6: // the parameter's name
			f.seen = appended(f.seen, child.text)
			f.value = f.spec.params[child.text]
		case 9:
			return true, true
		}
	}
	return true, false
}

// member is the schema of an object member's value (nil: any).
func (s *schema) member(key string) *schema {
	if s == nil {
		return nil
	}
	if sub, ok := s.properties[key]; ok {
		return sub
	}
	return s.additional
}

// unseen are the parameters a call may still name (nil: any).
func (spec *toolSpec) unseen(seen []string) []string {
	if spec.keys == nil {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(spec.keys), func(k string) bool { return slices.Contains(seen, k) })
}

// step takes the byte c (see action).
func (f *frame) step(p *parser, c byte) action {
	switch f.kind {
	case fLiteral:
		if c != f.text[f.n] {
			return reject
		}
		if f.n++; f.n == len(f.text) {
			return takeEnd
		}
		return take
	case fBlank:
		if !isBlank(c) {
			return passEnd
		}
		if f.n == maxBlank {
			return reject
		}
		f.n++
		return take
	case fName:
		switch {
		case c == f.delim:
			if f.text == "" || f.names != nil && !slices.Contains(f.names, f.text) {
				return reject
			}
			return takeEnd
		case c == '\n' || c == '<':
			return reject
		}
		if f.text += string(c); !withPrefix(f.names, f.text) {
			return reject
		}
		return take
	case fUntil:
		switch {
		case c == f.text[f.n]:
			if f.n++; f.n == len(f.text) {
				return takeEnd
			}
		case c == f.text[0]:
			f.n = 1
		default:
			f.n = 0
		}
		return take
	case fValue:
		return f.dispatch(c)
	case fEnum:
		if next := f.text + string(c); slices.ContainsFunc(f.s.enum, func(v string) bool { return strings.HasPrefix(v, next) }) {
			f.text = next
			return take
		}
		if slices.Contains(f.s.enum, f.text) {
			return passEnd
		}
		return reject
	case fString, fKey:
		return f.stringByte(c)
	case fNumber:
		return f.numberByte(c)
	case fObject:
		return f.objectByte(p, c)
	case fArray:
		return f.arrayByte(p, c)
	case fJSON:
		switch f.pc {
		case 0:
			f.pc = 1
			return p.push(blankFrame())
		case 1:
			f.pc = 2
			return p.push(valueFrame(f.s))
		}
		return reject
	case fThink:
		switch f.pc {
		case 0:
			f.pc = 1
			return p.push(frame{kind: fUntil, text: thinkClose})
		case 1:
			f.pc = 2
			return p.push(blankFrame())
		case 2:
			f.pc = 3
			return p.push(f.inner.root())
		}
		return reject
	case fCalls:
		switch f.pc {
		case 0:
			f.pc = 1
			return p.push(blankFrame())
		case 1:
			if f.n > 0 && !f.tools.parallel {
				return reject
			}
			f.pc = 2
			return p.push(frame{kind: fCall, tools: f.tools})
		}
		return reject
	case fCall:
		return f.callByte(p, c)
	}
	return reject
}

// dispatch turns a value frame into the frame of the value c begins, as
// schema.parse chooses it.
func (f *frame) dispatch(c byte) action {
	s := f.s
	switch {
	case s != nil && s.enum != nil:
		*f = frame{kind: fEnum, s: s}
	case c == '{' && s.allows("object"):
		*f = frame{kind: fObject, s: s, first: true}
	case c == '[' && s.allows("array"):
		*f = frame{kind: fArray, s: s, first: true}
	case c == '"' && s.allows("string"):
		*f = frame{kind: fString}
	case c == 't' && s.allows("boolean"):
		*f = literalFrame("true")
	case c == 'f' && s.allows("boolean"):
		*f = literalFrame("false")
	case c == 'n' && s.allows("null"):
		*f = literalFrame("null")
	case (c == '-' || isDigit(c)) && s.allows("integer"):
		*f = frame{kind: fNumber, integer: !s.allows("number")}
	default:
		return reject
	}
	return again
}

// stringByte reads a JSON string (a key also keeps its bytes, escapes as
// written, and must stay the beginning of an allowed key).
func (f *frame) stringByte(c byte) action {
	opening := f.n == 0
	switch f.n {
	case 0:
		if c != '"' {
			return reject
		}
		f.n = 1
	case 1:
		switch {
		case c == '"':
			if f.kind == fKey && f.names != nil && !slices.Contains(f.names, f.text) {
				return reject
			}
			return takeEnd
		case c < 0x20:
			return reject
		case c == '\\':
			f.n = 2
		}
	case 2:
		switch {
		case strings.IndexByte(`"\/bfnrt`, c) >= 0:
			f.n = 1
		case c == 'u':
			f.n = 3
		default:
			return reject
		}
	default: // \u: hex digit f.n-2 of 4
		if !strings.ContainsRune("0123456789abcdefABCDEF", rune(c)) {
			return reject
		}
		if f.n++; f.n == 7 {
			f.n = 1
		}
	}
	if f.kind == fKey {
		if !opening {
			f.text += string(c)
		}
		if !withPrefix(f.names, f.text) {
			return reject
		}
	}
	return take
}

// numberByte reads a JSON number as parseNumber does: n is the state.
// A number ends at the first byte that cannot continue it (which goes to
// the parent), so it never ends with the reply.
func (f *frame) numberByte(c byte) action {
	const (
		sign      = iota // an optional '-'
		leading          // the first digit
		afterZero        // a leading 0
		intDigits        // more digits of the integer part
		fraction         // an optional '.'
		fracFirst        // the fraction's first digit
		fracMore         // more fraction digits
		exponent         // an optional e or E
		expSign          // an optional sign
		expFirst         // the exponent's first digit
		expMore          // more exponent digits
	)
	for {
		switch f.n {
		case sign:
			f.n = leading
			if c == '-' {
				return take
			}
		case leading:
			switch {
			case c == '0':
				f.n = afterZero
			case isDigit(c):
				f.n = intDigits
			default:
				return reject
			}
			return take
		case afterZero, intDigits:
			if f.n == intDigits && isDigit(c) {
				return take
			}
			if f.integer {
				return passEnd
			}
			f.n = fraction
		case fraction:
			if c == '.' {
				f.n = fracFirst
				return take
			}
			f.n = exponent
		case fracFirst, expFirst:
			if !isDigit(c) {
				return reject
			}
			f.n++
			return take
		case fracMore:
			if isDigit(c) {
				return take
			}
			f.n = exponent
		case exponent:
			if c != 'e' && c != 'E' {
				return passEnd
			}
			f.n = expSign
			return take
		case expSign:
			f.n = expFirst
			if c == '+' || c == '-' {
				return take
			}
		default: // expMore
			if isDigit(c) {
				return take
			}
			return passEnd
		}
	}
}

// objectByte reads an object as parseObject does: members are white
// space, key, white space, ':', white space, value, white space.
func (f *frame) objectByte(p *parser, c byte) action {
	member := func(i int) frame {
		switch i {
		case 1:
			var allowed []string
			if f.s != nil && f.s.closed {
				allowed = slices.DeleteFunc(slices.Clone(f.s.keys), func(k string) bool { return slices.Contains(f.seen, k) })
			}
			return frame{kind: fKey, names: allowed} // its childDone is at pc 5
		case 3:
			return literalFrame(":")
		case 5:
			return valueFrame(f.value)
		}
		return blankFrame()
	}
	required := func() bool {
		return f.s == nil || !slices.ContainsFunc(f.s.required, func(k string) bool { return !slices.Contains(f.seen, k) })
	}
	more := func() bool { return f.s == nil || !f.s.closed || len(f.seen) < len(f.s.keys) }
	return f.sequenceByte(p, c, '}', 7, member, required, more)
}

// arrayByte reads an array: items are white space, value, white space.
func (f *frame) arrayByte(p *parser, c byte) action {
	item := func(i int) frame {
		if i != 1 {
			return blankFrame()
		}
		var items *schema
		if f.s != nil {
			items = f.s.items
		}
		return valueFrame(items)
	}
	always := func() bool { return true }
	return f.sequenceByte(p, c, ']', 3, item, always, always)
}

// sequenceByte reads what sequence does: the opening byte, white space,
// then items separated by commas, then the closing byte. An item is parts
// frames, part(0) … part(parts-1), read in turn (pc 3 … 2+parts); done
// checks the whole before it closes; more says whether an item may follow.
func (f *frame) sequenceByte(p *parser, c, closing byte, parts int, part func(int) frame, done, more func() bool) action {
	switch {
	case f.pc == 0:
		f.pc = 1
		return take // the opening byte
	case f.pc == 1:
		f.pc = 2
		return p.push(blankFrame())
	case f.pc == 2: // after an item (or none yet)
		switch {
		case c == closing:
			if !done() {
				return reject
			}
			return takeEnd
		case c == ',' && !f.first:
			if !more() {
				return reject // nothing may follow
			}
			f.pc = 3
			return take
		case !f.first:
			return reject
		}
		f.pc = 3
		return again
	case f.pc < 3+parts:
		f.pc++
		return p.push(part(f.pc - 4))
	}
	f.first, f.pc = false, 2
	return again
}

// callByte reads one call as toolCallsGrammar.call does:
// <tool_call>\n<function=NAME>\n, then parameters
// (<parameter=NAME>\nVALUE\n</parameter>\n), then </function>\n</tool_call>.
func (f *frame) callByte(p *parser, c byte) action {
	switch f.pc {
	case 0:
		f.pc = 1
		return p.push(literalFrame(toolCallOpen + "\n" + functionOpen))
	case 1:
		f.pc = 2
		names := make([]string, len(f.tools.functions))
		for i, fn := range f.tools.functions {
			names[i] = fn.name
		}
		return p.push(frame{kind: fName, delim: '>', names: names})
	case 2:
		f.pc = 3
		return p.push(literalFrame("\n"))
	case 3:
		f.pc = 4
		return p.push(literalFrame("<"))
	case 4:
		if c == '/' {
			if slices.ContainsFunc(f.spec.required, func(r string) bool { return !slices.Contains(f.seen, r) }) {
				return reject // a required parameter is missing
			}
			f.pc = 9
			return p.push(literalFrame("/function>\n" + toolCallClose))
		}
		f.pc = 5
		return p.push(literalFrame(paramOpen[1:]))
	case 5:
		f.pc = 6
		return p.push(frame{kind: fName, delim: '>', names: f.spec.unseen(f.seen)})
	case 6:
		f.pc = 7
		return p.push(literalFrame("\n"))
	case 7:
		if f.value != nil {
			f.pc = 8
			return p.push(valueFrame(f.value))
		}
		f.pc = 10
		return p.push(frame{kind: fUntil, text: "\n" + paramClose})
	case 8:
		f.pc = 3
		return p.push(literalFrame("\n" + paramClose + "\n"))
	case 10:
		f.pc = 3
		return p.push(literalFrame("\n"))
	}
	return reject
}
