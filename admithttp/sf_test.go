package admithttp_test

// A strict parser for the Structured Field Lists (RFC 9651, section 4.2)
// that RateLimit-Policy and RateLimit are: enough of the grammar to check
// every field the middleware writes, and to refuse anything else. It
// parses Items whose bare items are Integers, Strings, Tokens and
// Booleans; Decimals, Byte Sequences, Dates, Display Strings and Inner
// Lists are refused, since the draft uses none of them here.

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// An sfItem is one member of a List: its bare item and its parameters in
// order. A bare item is an int64, a string (sf-string), an sfToken or a
// bool.
type sfItem struct {
	Value  any
	Params []sfParam
}

type sfParam struct {
	Key   string
	Value any
}

type sfToken string

// param returns the value of the parameter named key, and whether it is
// there.
func (it sfItem) param(key string) (any, bool) {
	for _, p := range it.Params {
		if p.Key == key {
			return p.Value, true
		}
	}
	return nil, false
}

// parseSFList parses a field value as a List, as RFC 9651 section 4.2
// does: leading and trailing spaces are dropped, and an empty value is an
// empty List. (The middleware's fields are single lines; a field split
// over several lines is joined with ", " before parsing.)
func parseSFList(field string) ([]sfItem, error) {
	p := &sfParser{s: strings.Trim(field, " ")}
	var items []sfItem
	for len(items) < 1000 && !p.done() {
		it, err := p.item()
		if err != nil {
			return nil, fmt.Errorf("member %d: %w", len(items), err)
		}
		items = append(items, it)
		p.ows()
		if p.done() {
			return items, nil
		}
		if p.next() != ',' {
			return nil, fmt.Errorf("after member %d: want ',' at %d in %q", len(items)-1, p.i-1, p.s)
		}
		p.ows()
		if p.done() {
			return nil, fmt.Errorf("trailing comma in %q", p.s)
		}
	}
	if !p.done() {
		return nil, fmt.Errorf("more than 1000 members in %q", p.s)
	}
	return items, nil
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }
func (p *sfParser) peek() byte {
	if p.done() {
		return 0
	}
	return p.s[p.i]
}
func (p *sfParser) next() byte { c := p.peek(); p.i++; return c }

// ows skips optional whitespace (SP and HTAB) between List members.
func (p *sfParser) ows() {
	for !p.done() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{Value: v}
	for len(it.Params) < 100 && p.peek() == ';' {
		p.i++
		for p.peek() == ' ' {
			p.i++
		}
		key, err := p.key()
		if err != nil {
			return sfItem{}, err
		}
		var val any = true
		if p.peek() == '=' {
			p.i++
			if val, err = p.bareItem(); err != nil {
				return sfItem{}, fmt.Errorf("parameter %s: %w", key, err)
			}
		}
		for j, q := range it.Params { // a repeated key overwrites in place
			if q.Key == key {
				it.Params[j].Value = val
				key = ""
			}
		}
		if key != "" {
			it.Params = append(it.Params, sfParam{key, val})
		}
	}
	return it, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if c := p.peek(); !(c >= 'a' && c <= 'z' || c == '*') {
		return "", fmt.Errorf("key must start with a lowercase letter or '*' at %d in %q", p.i, p.s)
	}
	for !p.done() {
		c := p.s[p.i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem() (any, error) {
	switch c := p.peek(); {
	case c == '-' || c >= '0' && c <= '9':
		return p.integer()
	case c == '"':
		return p.str()
	case c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '*':
		return p.token(), nil
	case c == '?':
		p.i++
		switch p.next() {
		case '0':
			return false, nil
		case '1':
			return true, nil
		}
		return nil, fmt.Errorf("bad Boolean in %q", p.s)
	default:
		return nil, fmt.Errorf("unsupported or bad bare item at %d in %q", p.i, p.s)
	}
}

func (p *sfParser) integer() (int64, error) {
	start := p.i
	if p.peek() == '-' {
		p.i++
	}
	digits := p.i
	for !p.done() && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		p.i++
	}
	switch n := p.i - digits; {
	case n == 0:
		return 0, fmt.Errorf("no digit at %d in %q", digits, p.s)
	case n > 15:
		return 0, fmt.Errorf("integer of %d digits (at most 15) in %q", n, p.s)
	case p.peek() == '.':
		return 0, fmt.Errorf("a Decimal at %d in %q; the draft's parameters are Integers", start, p.s)
	}
	return strconv.ParseInt(p.s[start:p.i], 10, 64)
}

func (p *sfParser) str() (string, error) {
	p.i++ // the opening quote
	var b strings.Builder
	for !p.done() {
		c := p.next()
		switch {
		case c == '\\':
			e := p.next()
			if e != '"' && e != '\\' {
				return "", fmt.Errorf("bad escape \\%c in %q", e, p.s)
			}
			b.WriteByte(e)
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("byte %#x in a String in %q", c, p.s)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("unterminated String in %q", p.s)
}

func (p *sfParser) token() sfToken {
	start := p.i
	p.i++
	for !p.done() {
		c := p.s[p.i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),;<=>?@[\\]{}", c) >= 0 {
			break
		}
		p.i++
	}
	return sfToken(p.s[start:p.i])
}

// TestSFParser: the helper reads the draft's examples and refuses what RFC
// 9651 refuses, so that checkFields can be trusted.
func TestSFParser(t *testing.T) {
	for _, ok := range []string{
		`"burst";q=100;w=60,"daily";q=1000;w=86400`,
		`"peruser";q=65535;qu="content-bytes";w=10`,
		`"hour";q=1000;w=3600, "day";q=5000;w=86400`,
		`"default";r=50;t=30`,
		` "a\"b\\c";r=0;t=0 `,
		`tok;flag;n=-1, "x";b=?0`,
		``,
	} {
		if _, err := parseSFList(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	items, _ := parseSFList(`"a\"b\\c";q=1;flag, t*k`)
	want := []sfItem{{`a"b\c`, []sfParam{{"q", int64(1)}, {"flag", true}}}, {sfToken("t*k"), nil}}
	if fmt.Sprint(items) != fmt.Sprint(want) {
		t.Errorf("parsed %v, want %v", items, want)
	}
	for _, bad := range []string{
		`"a";q=1,`,               // trailing comma
		`"a";q=1 "b"`,            // no comma
		`"a";q=1.5`,              // a Decimal
		`"a";Q=1`,                // an uppercase key
		`"a\x";q=1`,              // a bad escape
		`"a;q=1`,                 // unterminated
		`"a";q=1234567890123456`, // 16 digits
		`"a";q=`,                 // no value
		"\"caf\xc3\xa9\";q=1",    // not ASCII
		`,"a"`,                   // leading comma
	} {
		if items, err := parseSFList(bad); err == nil {
			t.Errorf("%q parsed as %v; want an error", bad, items)
		}
	}
}
