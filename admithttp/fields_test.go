package admithttp_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
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
	srv, c := newMini(t)
	lim := admit.New(c)
	rule := func(*http.Request) admithttp.Rule {
		return admithttp.Rule{First: admithttp.Bucket{Policy: "own", Key: "{x}:own", Spec: own},
			Second: &admithttp.Bucket{Policy: "shared", Key: "{x}:shared", Spec: shared}}
	}
	h := mustNew(t, lim, rule, refuseAll, admithttp.WithHeaders())(&recordingHandler{})
	now := t0
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
