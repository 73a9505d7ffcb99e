package admithttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/internal/minitest"
	"github.com/google/go-cmp/cmp"
	"github.com/valkey-io/valkey-go"
)

var tightStandard = admit.MustSpec(admit.Every(time.Minute), 2) // the candidate: 2 where 6 are enforced

// shadowTally counts a Shadow's reports.
type shadowTally struct {
	reports                   []admithttp.ShadowReport
	admitted, refused, failed int
	refusedWhatEnforcedAdmits int
}

func (s *shadowTally) report(r admithttp.ShadowReport) {
	s.reports = append(s.reports, r)
	switch {
	case r.Err != nil:
		s.failed++
	case r.Decision.Allowed():
		s.admitted++
	default:
		s.refused++
		if r.Enforced.Allowed() {
			s.refusedWhatEnforcedAdmits++
		}
	}
}

// keyState is every key of the server with its fields and expiry, as the
// server holds them.
func keyState(t *testing.T, c valkey.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Do(ctx, c.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	state := map[string]string{}
	for _, k := range keys {
		fields, err := c.Do(ctx, c.B().Hgetall().Key(k).Build()).AsStrMap()
		if err != nil {
			t.Fatalf("HGETALL %s: %v", k, err)
		}
		pttl, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PTTL %s: %v", k, err)
		}
		names := make([]string, 0, len(fields))
		for f := range fields {
			names = append(names, f)
		}
		slices.Sort(names)
		var b strings.Builder
		for _, f := range names {
			fmt.Fprintf(&b, "%s=%q ", f, fields[f])
		}
		fmt.Fprintf(&b, "pttl=%d", pttl)
		state[k] = b.String()
	}
	return state
}

// TestShadowNeverRefusesNorTouchesEnforced runs the same traffic on two
// servers with frozen clocks, one with two shadow rules and one without:
// every response is the same byte for byte, every enforced key holds the
// same state, and the shadows' keys are all under ShadowPrefix. The
// "tight" candidate would have refused what the counts say; the "same"
// candidate, the enforced rule on shadow keys, decides exactly as the
// enforced rule does.
func TestShadowNeverRefusesNorTouchesEnforced(t *testing.T) {
	_, withShadow := minitest.Start(t)
	_, without := minitest.Start(t)
	var tight, same shadowTally
	shadowed := mustNew(t, admit.New(withShadow), lanes("t:"), refuseAll, admithttp.WithHeaders(),
		admithttp.WithShadow(admithttp.Shadow{Name: "tight", Report: tight.report,
			Rule: func(_ *http.Request, enforced admithttp.Rule) admithttp.Rule {
				if enforced.Second == nil {
					return admithttp.Rule{} // premium: not a candidate's business
				}
				enforced.First.Spec = tightStandard
				// Second is a copy: the enforced Rule (and its fields)
				// keep the shared Spec.
				enforced.Second.Spec = admit.MustSpec(admit.Every(time.Minute), 100)
				return enforced
			}}),
		admithttp.WithShadow(admithttp.Shadow{Name: "same", Report: same.report,
			Rule: func(_ *http.Request, enforced admithttp.Rule) admithttp.Rule { return enforced }}),
	)(&recordingHandler{})
	plain := mustNew(t, admit.New(without), lanes("t:"), refuseAll, admithttp.WithHeaders())(&recordingHandler{})

	for i, st := range premiumStory() {
		a, b := send(shadowed, st.plan, st.user), send(plain, st.plan, st.user)
		if a.Code != b.Code || a.Body.String() != b.Body.String() || !cmp.Equal(a.Header(), b.Header()) {
			t.Errorf("step %d (%s/%s): with shadows %d %v %q; without %d %v %q",
				i, st.plan, st.user, a.Code, a.Header(), a.Body, b.Code, b.Header(), b.Body)
		}
	}

	// u1: 7 standard requests, the candidate's own bucket admits 2; u2: 1,
	// admitted. Of the 5 it refuses, 4 were admitted by the enforced rule.
	if tight.admitted != 3 || tight.refused != 5 || tight.failed != 0 || tight.refusedWhatEnforcedAdmits != 4 {
		t.Errorf("tight: %d admitted, %d refused (%d of them admitted by the enforced rule), %d failed; want 3, 5 (4), 0",
			tight.admitted, tight.refused, tight.refusedWhatEnforcedAdmits, tight.failed)
	}
	// The enforced rule on keys of its own: 13 limited requests, decided
	// exactly as enforced (the request without a rule is skipped).
	if len(same.reports) != 13 {
		t.Errorf("same: %d reports; want 13", len(same.reports))
	}
	for i, r := range same.reports {
		if r.Err != nil || r.Decision != r.Enforced {
			t.Errorf("same, report %d: %v (err %v), enforced %v", i, r.Decision, r.Err, r.Enforced)
		}
		for _, k := range []string{r.Rule.First.Key, secondKey(r.Rule)} {
			if k != "" && !strings.HasPrefix(k, admithttp.ShadowPrefix+"same:t:{api}:") {
				t.Errorf("same, report %d: key %q outside the shadow's namespace", i, k)
			}
		}
	}

	got, want := keyState(t, withShadow), keyState(t, without)
	shadowKeys := 0
	for k, v := range got {
		if strings.HasPrefix(k, admithttp.ShadowPrefix) {
			shadowKeys++
			continue
		}
		if want[k] != v {
			t.Errorf("enforced key %s: %s with shadows, %s without", k, v, want[k])
		}
		delete(want, k)
	}
	if len(want) != 0 {
		t.Errorf("enforced keys missing with shadows: %v", want)
	}
	// tight: u1, u2, shared; same: u1, shared (its u2 request was refused
	// by the shared bucket, all or nothing: u2's fresh bucket unwritten).
	if shadowKeys != 5 {
		t.Errorf("%d shadow keys; want 5: %v", shadowKeys, got)
	}
}

func secondKey(r admithttp.Rule) string {
	if r.Second == nil {
		return ""
	}
	return r.Second.Key
}

// TestShadowErrorNeverRefuses: a shadow decision that fails is reported
// with its error; the request is answered by the enforced rule alone.
func TestShadowErrorNeverRefuses(t *testing.T) {
	_, c := minitest.Start(t)
	var tally shadowTally
	next := &recordingHandler{}
	h := mustNew(t, admit.New(&shadowFailingClient{Client: c}), lanes("t:"), refuseAll,
		admithttp.WithShadow(admithttp.Shadow{Name: "s", Report: tally.report,
			Rule: func(_ *http.Request, enforced admithttp.Rule) admithttp.Rule { return enforced }}),
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { t.Errorf("enforced path reported %v", err) }),
	)(next)
	for i := range 3 {
		if rec := send(h, "premium", ""); rec.Code != 200 || next.calls != i+1 {
			t.Fatalf("request %d: status %d, handler ran %d times", i, rec.Code, next.calls)
		}
	}
	if tally.failed != 3 || !errors.Is(tally.reports[0].Err, io.ErrUnexpectedEOF) || !errors.Is(tally.reports[0].Err, admit.ErrOutcomeUnknown) {
		t.Errorf("%d failed reports, first %v; want 3, io.ErrUnexpectedEOF as outcome unknown", tally.failed, tally.reports[0].Err)
	}
}

// shadowFailingClient fails every command that names a shadow key.
type shadowFailingClient struct{ valkey.Client }

func (c *shadowFailingClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	for _, arg := range cmd.Commands() {
		if strings.HasPrefix(arg, admithttp.ShadowPrefix) {
			return valkey.NewErrorResult(io.ErrUnexpectedEOF)
		}
	}
	return c.Client.Do(ctx, cmd)
}

// TestShadowOnUnlimitedRoute: a shadow may try a limit on a route that has
// none; it never refuses there either, and reports Enforced as the zero
// Decision.
func TestShadowOnUnlimitedRoute(t *testing.T) {
	_, c := minitest.Start(t)
	var tally shadowTally
	next := &recordingHandler{}
	h := mustNew(t, admit.New(c), lanes("t:"), refuseAll,
		admithttp.WithShadow(admithttp.Shadow{Name: "new-route-limit", Report: tally.report,
			Rule: func(*http.Request, admithttp.Rule) admithttp.Rule {
				return admithttp.Rule{First: admithttp.Bucket{Policy: "all", Key: "t:{api}:all", Spec: tightStandard}}
			}}),
	)(next)
	for range 5 {
		if rec := send(h, "", ""); rec.Code != 200 {
			t.Fatalf("status %d", rec.Code)
		}
	}
	if next.calls != 5 || tally.admitted != 2 || tally.refused != 3 || tally.refusedWhatEnforcedAdmits != 0 {
		t.Errorf("handler ran %d times; shadow %d admitted, %d refused; want 5; 2, 3", next.calls, tally.admitted, tally.refused)
	}
	if r := tally.reports[0]; r.Enforced != (admit.Decision{}) || r.Rule.First.Key != admithttp.ShadowPrefix+"new-route-limit:t:{api}:all" {
		t.Errorf("report %+v", r)
	}
}
