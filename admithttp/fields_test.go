package admithttp_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/internal/minitest"
)

// TestEffectiveWindowMeansWhatItSays checks the package doc's promises on
// the fields against the buckets themselves, on a clock the test moves:
//
//   - t of the refusing bucket is Retry-After, and Retry-After is its
//     RetryAfter rounded up: a client that waits it finds the tokens, one
//     that waits a second less does not;
//   - t of a bucket that did not refuse is its Interval rounded up, and
//     within t it holds more than r;
//   - a full bucket has no t; w is Burst × Interval rounded up, q the
//     burst.
func TestEffectiveWindowMeansWhatItSays(t *testing.T) {
	// 7 s a token, 3 at once: the first bucket; 5 s a token, 2 at once:
	// the second.
	own := admit.MustSpec(admit.Every(7*time.Second), 3)
	shared := admit.MustSpec(admit.Every(5*time.Second), 2)
	srv, c := minitest.Start(t)
	lim := admit.New(c)
	rule := func(*http.Request) admithttp.Rule {
		return admithttp.Rule{First: admithttp.Bucket{Policy: "own", Key: "{x}:own", Spec: own},
			Second: &admithttp.Bucket{Policy: "shared", Key: "{x}:shared", Spec: shared}}
	}
	h := mustNew(t, lim, rule, refuseAll, admithttp.WithHeaders())(&recordingHandler{})
	now := minitest.Epoch
	at := func(d time.Duration) { now = now.Add(d); srv.SetTime(now) }
	// holds returns what a bucket holds now, by a Peek that writes nothing.
	holds := func(key string, spec admit.Spec) int {
		d, err := lim.Peek(context.Background(), admit.Request{Key: key, Spec: spec}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed() {
			return d.Remaining[0]
		}
		return d.Remaining[0] + 1
	}
	type param struct{ r, t int64 }
	fields := func(rec interface{ Header() http.Header }) map[string]param {
		items, err := parseSFList(rec.Header().Get(admithttp.LimitField))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]param{}
		for _, it := range items {
			r, _ := it.param(admithttp.RemainingParam)
			p := param{r: r.(int64), t: -1}
			if v, ok := it.param(admithttp.ResetParam); ok {
				p.t = v.(int64)
			}
			out[it.Value.(string)] = p
		}
		return out
	}

	if got := send(h, "", "").Header().Get(admithttp.PolicyField); got != fmtPolicy("own", 3, 21)+", "+fmtPolicy("shared", 2, 10) {
		t.Errorf("RateLimit-Policy %s", got)
	}
	at(3 * time.Second)
	rec := send(h, "", "") // own 1 left, shared 0 left: admitted
	f := fields(rec)
	if rec.Code != 200 || f["own"] != (param{1, 7}) || f["shared"] != (param{0, 5}) {
		t.Fatalf("second request: %d %v", rec.Code, f)
	}
	// Within t, each bucket holds more than r (here: a token).
	at(5 * time.Second)
	if got := holds("{x}:shared", shared); got <= 0 {
		t.Errorf("shared holds %d five seconds after r=0;t=5", got)
	}
	at(-5 * time.Second)

	// The shared bucket refuses: its t is Retry-After; the first bucket,
	// not charged, keeps its 1 token, its t the next token's bound.
	at(time.Second)
	rec = send(h, "", "")
	f = fields(rec)
	ra, _ := strconv.ParseInt(rec.Header().Get("Retry-After"), 10, 64)
	if rec.Code != 429 || f["shared"].r != 0 || f["shared"].t != ra || f["own"] != (param{1, 7}) {
		t.Fatalf("refusal: %d, Retry-After %d, %v", rec.Code, ra, f)
	}
	if err := checkFields(rec.Header(), "shared"); err != nil {
		t.Error(err)
	}
	// A second less than Retry-After is not enough; Retry-After is.
	at(time.Duration(ra-1) * time.Second)
	if got := holds("{x}:shared", shared); got != 0 {
		t.Errorf("shared holds %d one second before Retry-After", got)
	}
	at(time.Second)
	if got := holds("{x}:shared", shared); got < 1 {
		t.Errorf("shared holds %d at Retry-After", got)
	}
	// Long after, both full: an admission leaves r = burst-1, t the
	// Interval, exactly the next token's wait.
	at(time.Hour)
	rec = send(h, "", "")
	f = fields(rec)
	if rec.Code != 200 || f["own"] != (param{2, 7}) || f["shared"] != (param{1, 5}) {
		t.Errorf("after an hour: %d %v", rec.Code, f)
	}
	at(7*time.Second - time.Microsecond)
	if got := holds("{x}:own", own); got != 2 {
		t.Errorf("own holds %d just before t", got)
	}
	at(time.Microsecond)
	if got := holds("{x}:own", own); got != 3 {
		t.Errorf("own holds %d at t", got)
	}

	// A full first bucket, the second empty: the first's r is its burst,
	// with no t.
	for range 2 {
		send(h, "", "")
	}
	at(time.Hour)
	_, _ = lim.AllowAll(context.Background(), admit.Request{Key: "{x}:shared", Spec: shared, Cost: 2}, nil)
	rec = send(h, "", "")
	f = fields(rec)
	if rec.Code != 429 || f["own"] != (param{3, -1}) || f["shared"].r != 0 {
		t.Errorf("full first bucket: %d %v", rec.Code, f)
	}
	if err := checkFields(rec.Header(), "shared"); err != nil {
		t.Error(err)
	}
}

// TestParameterNamesInOnePlace: the draft's parameter names appear in the
// package's code only in fields.go's const block, so that a revision that
// renames them (the editor's copy after -11 renames r and t and adds c) is
// one edit there.
func TestParameterNamesInOnePlace(t *testing.T) {
	names := map[string]bool{}
	for _, n := range []string{admithttp.QuotaParam, admithttp.UnitParam, admithttp.WindowParam, admithttp.RemainingParam, admithttp.ResetParam} {
		names[n] = true
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		inConsts := map[*ast.BasicLit]bool{}
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST && e.Name() == "fields.go" {
				ast.Inspect(g, func(n ast.Node) bool {
					if l, ok := n.(*ast.BasicLit); ok {
						inConsts[l] = true
					}
					return true
				})
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			l, ok := n.(*ast.BasicLit)
			if !ok || l.Kind != token.STRING || inConsts[l] {
				return true
			}
			s, _ := strconv.Unquote(l.Value)
			for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == '=' }) {
				if names[part] && (strings.Contains(s, "=") || strings.Contains(s, ";") || s == part) {
					t.Errorf("%s: %s holds the draft's parameter name %q outside fields.go's const block", fset.Position(l.Pos()), l.Value, part)
				}
			}
			return true
		})
	}
}

// A strict parser for the Structured Field Lists (RFC 9651, section 4.2)
// that RateLimit-Policy and RateLimit are: enough of the grammar to check
// every field the middleware writes, and to refuse anything else. It
// parses Items whose bare items are Integers, Strings, Tokens and
// Booleans; Decimals, Byte Sequences, Dates, Display Strings and Inner
// Lists are refused, since the draft uses none of them here.

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

// TestXRateLimit: WithXRateLimit sets X-RateLimit-Limit, -Remaining and
// -Reset on admitted responses and refusals, of the refusing part or else
// the one with the fewest tokens left; without it, none. A cost of 6 on a
// bucket of 10 refilling 1/s, on a frozen clock: Reset is the Unix time of
// the next token, 1 s on.
func TestXRateLimit(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tpm := admit.MustSpec(admit.Every(time.Second), 10)
	wide := admit.MustSpec(admit.Every(time.Second), 100)
	for _, with := range []bool{false, true} {
		local, err := admit.NewLocal(100, admit.WithLocalClock(func() time.Time { return now }))
		if err != nil {
			t.Fatal(err)
		}
		opts := []admithttp.Option{}
		if with {
			opts = append(opts, admithttp.WithXRateLimit())
		}
		mw, err := admithttp.New(local, func(*http.Request) admithttp.Rule {
			return admithttp.Rule{First: admithttp.Bucket{Policy: "tpm", Key: "tpm", Spec: tpm, Cost: 6},
				Second: &admithttp.Bucket{Policy: "wide", Key: "wide", Spec: wide}}
		}, refuseAll, opts...)
		if err != nil {
			t.Fatal(err)
		}
		h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		for i, want := range []struct {
			code             int
			limit, remaining string
		}{{200, "10", "4"}, {429, "10", "4"}} {
			// Reset is now + 1 s in Unix seconds, rounded up: never early.
			ceil := func(t time.Time) int64 { return (t.Add(time.Second).UnixNano() + 1e9 - 1) / 1e9 }
			before := ceil(time.Now())
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			after := ceil(time.Now())
			got := rec.Header()
			if rec.Code != want.code {
				t.Fatalf("request %d: %d, want %d", i, rec.Code, want.code)
			}
			if !with {
				if v := got.Get("X-RateLimit-Limit") + got.Get("X-RateLimit-Remaining") + got.Get("X-RateLimit-Reset"); v != "" {
					t.Errorf("request %d without WithXRateLimit: X-RateLimit fields %q; want none", i, v)
				}
				continue
			}
			reset, err := strconv.ParseInt(got.Get("X-RateLimit-Reset"), 10, 64)
			if got.Get("X-RateLimit-Limit") != want.limit || got.Get("X-RateLimit-Remaining") != want.remaining ||
				err != nil || reset < before || reset > after {
				t.Errorf("request %d: X-RateLimit %s/%s reset %s; want %s/%s reset %d to %d",
					i, got.Get("X-RateLimit-Limit"), got.Get("X-RateLimit-Remaining"), got.Get("X-RateLimit-Reset"), want.limit, want.remaining, before, after)
			}
		}
	}
}
