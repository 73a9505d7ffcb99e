package admithttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/valkey-io/valkey-go"
)

// A Rule's concurrency part, on miniredis, whose clock the tests freeze:
// no lease expires while a test runs unless the test moves the clock.

// concSpec is the concurrency part of these tests: 4 at once, a lease of
// 30 s.
var concSpec = admit.MustConcurrency(4, 30*time.Second)

// wideSpec is a bucket that no test here empties.
var wideSpec = admit.MustSpec(admit.Every(time.Minute), 1000)

// concRule is a Rule of a concurrency part (policy "conc") and one bucket
// (policy "tpm"), both under prefix with the hash tag {org}.
func concRule(prefix string, spec admit.Concurrency, bucket admit.Spec) admithttp.Rule {
	return admithttp.Rule{
		Concurrent: &admithttp.Concurrent{Policy: "conc", Key: prefix + "{org}:conc", Spec: spec},
		First:      admithttp.Bucket{Policy: "tpm", Key: prefix + "{org}:tpm", Spec: bucket},
	}
}

// holders is the number of members of the lease key: the slots taken.
func holders(t *testing.T, c valkey.Client, key string) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Zcard().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("ZCARD %s: %v", key, err)
	}
	return n
}

// inFlight counts the handlers running at once, exactly, and the most it
// has seen.
type inFlight struct {
	now, most atomic.Int64
}

func (f *inFlight) enter() int64 {
	n := f.now.Add(1)
	for {
		m := f.most.Load()
		if n <= m || f.most.CompareAndSwap(m, n) {
			return n
		}
	}
}

func (f *inFlight) leave() { f.now.Add(-1) }

// TestConcurrentAtMostN: 50 clients at once against a limit of 4. First
// gated: the 4 admitted handlers hold their slots until the 46 others have
// been refused, so exactly 4 run and 46 get a 429 naming the concurrency
// policy, with fields that pass the draft's checks; then free-running, 50
// clients of 10 requests each, where no more than 4 handlers are ever
// inside at once. After each phase every slot is free again, and the
// bucket was charged for the admitted requests only.
func TestConcurrentAtMostN(t *testing.T) {
	_, c := newMini(t)
	const clients, n = 50, 4
	rule := concRule("atmost:", concSpec, wideSpec)
	var (
		flight     inFlight
		full       = make(chan struct{})
		gate       = make(chan struct{})
		fullOnce   sync.Once
		gated      atomic.Bool
		fieldsSeen atomic.Value
	)
	gated.Store(true)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer flight.leave()
		if flight.enter() == n {
			fullOnce.Do(func() { close(full) })
		}
		if gated.Load() {
			fieldsSeen.Store(w.Header().Clone())
			select {
			case <-gate:
			case <-time.After(10 * time.Second): // bound: the test fails below
			}
		}
		io.WriteString(w, "ok")
	})
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll, admithttp.WithHeaders())(next)

	type answer struct {
		code int
		err  error
	}
	answers := make(chan answer, clients)
	for range clients {
		go func() {
			rec := send(h, "", "")
			a := answer{code: rec.Code}
			if rec.Code == http.StatusTooManyRequests {
				a.err = checkFields(rec.Header(), "conc")
				if p := problemOf(t, rec); fmt.Sprint(p["violated-policies"]) != "[conc]" {
					a.err = errors.Join(a.err, fmt.Errorf("violated-policies %v, want [conc]", p["violated-policies"]))
				}
				if got, want := rec.Header().Get(admithttp.LimitField), `"conc";r=0;t=30`; got != want {
					a.err = errors.Join(a.err, fmt.Errorf("RateLimit %q, want %q: the slot refused, no bucket evaluated", got, want))
				}
			}
			answers <- a
		}()
	}
	select {
	case <-full:
	case <-time.After(10 * time.Second):
		t.Fatal("the limit's 4 handlers never ran at once")
	}
	count := map[int]int{}
	for range clients - n {
		select {
		case a := <-answers:
			count[a.code]++
			if a.err != nil {
				t.Error(a.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("answers so far %v; want %d refusals while the 4 slots are held", count, clients-n)
		}
	}
	if count[http.StatusTooManyRequests] != clients-n {
		t.Fatalf("while 4 handlers held their slots: %v; want %d refusals", count, clients-n)
	}
	if got := holders(t, c, "atmost:{org}:conc"); got != n {
		t.Errorf("%d slots taken while 4 handlers run", got)
	}
	h0 := fieldsSeen.Load().(http.Header)
	if err := checkFields(h0, ""); err != nil {
		t.Error(err)
	}
	if got, want := h0.Get(admithttp.PolicyField), `"conc";q=4;qu="concurrent-requests", "tpm";q=1000;w=60000`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	close(gate)
	for range n {
		if a := <-answers; a.code != http.StatusOK {
			t.Errorf("an admitted request answered %d", a.code)
		}
	}
	if most := flight.most.Load(); most != n {
		t.Errorf("at most %d handlers inside at once, want exactly %d", most, n)
	}
	if got := holders(t, c, "atmost:{org}:conc"); got != 0 {
		t.Errorf("%d slots still taken after every handler returned", got)
	}

	// Free-running: bounded, 50 × 10 requests.
	gated.Store(false)
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				switch rec := send(h, "", ""); rec.Code {
				case http.StatusOK:
					admitted.Add(1)
				case http.StatusTooManyRequests:
					refused.Add(1)
				default:
					t.Errorf("status %d", rec.Code)
				}
			}
		}()
	}
	wg.Wait()
	if most := flight.most.Load(); most > n {
		t.Errorf("%d handlers inside at once; the limit is %d", most, n)
	}
	if admitted.Load()+refused.Load() != clients*10 || admitted.Load() < n {
		t.Errorf("%d admitted, %d refused, of %d", admitted.Load(), refused.Load(), clients*10)
	}
	if got := holders(t, c, "atmost:{org}:conc"); got != 0 {
		t.Errorf("%d slots still taken after every handler returned", got)
	}
	// The bucket paid for admissions only: the 4 gated ones, and each
	// free-running admission.
	d, err := admit.New(c).Peek(context.Background(), rule.First.Request(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(wideSpec.Burst()) - n - admitted.Load(); int64(d.Remaining[0])+1 != want {
		t.Errorf("bucket holds %d, want %d: a refused request took a token", d.Remaining[0]+1, want)
	}
	t.Logf("limit %d: at most %d in flight; free-running %d admitted, %d refused", n, flight.most.Load(), admitted.Load(), refused.Load())
}

// errBoom is the panic of a handler.
var errBoom = errors.New("boom")

// TestConcurrentPanicFreesSlot: a handler that panics frees its slot, and
// the panic goes on up, unchanged, to the server (which recovers it).
func TestConcurrentPanicFreesSlot(t *testing.T) {
	_, c := newMini(t)
	one := admit.MustConcurrency(1, 30*time.Second)
	rule := concRule("panic:", one, wideSpec)
	var reported []error
	panics := true
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll,
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { reported = append(reported, err) }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if panics {
				panic(errBoom)
			}
			io.WriteString(w, "ok")
		}))
	for i := range 3 {
		func() {
			defer func() {
				if p := recover(); p != errBoom {
					t.Errorf("panic %d: recovered %v, want the handler's own", i, p)
				}
			}()
			send(h, "", "")
		}()
		if got := holders(t, c, "panic:{org}:conc"); got != 0 {
			t.Fatalf("after panic %d: %d slots taken; a panicking handler must free its slot", i, got)
		}
	}
	panics = false
	if rec := send(h, "", ""); rec.Code != http.StatusOK {
		t.Errorf("after the panics, the one slot: %d, want 200", rec.Code)
	}
	if len(reported) != 0 {
		t.Errorf("errors reported: %v", reported)
	}
}

// TestConcurrentSlotRefusalTakesNothing: while every slot is taken, a
// request is refused by the concurrency part, and both buckets stay as
// they were, byte for byte; the outcome hook sees Refused with the Lease
// naming the slot. A bucket's refusal takes no slot either.
func TestConcurrentSlotRefusalTakesNothing(t *testing.T) {
	_, c := newMini(t)
	ctx := context.Background()
	one := admit.MustConcurrency(1, 30*time.Second)
	second := admithttp.Bucket{Policy: "shared", Key: "refuse:{org}:shared", Spec: sharedSpec}
	rule := concRule("refuse:", one, standardSpec)
	rule.Second = &second
	var events []admithttp.Event
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll,
		admithttp.WithOutcome(func(e admithttp.Event) { events = append(events, e) }))(&recordingHandler{})
	if rec := send(h, "", ""); rec.Code != http.StatusOK {
		t.Fatalf("first request: %d", rec.Code)
	}
	before := map[string]map[string]string{}
	for _, k := range []string{rule.First.Key, second.Key} {
		before[k] = hashOf(t, c, k)
	}
	// Another holder takes the one slot.
	x, err := admit.New(c).Acquire(ctx, admit.Slot{Key: rule.Concurrent.Key, Spec: one}, nil, nil)
	if err != nil || !x.Granted() {
		t.Fatalf("Acquire: %v %v", x, err)
	}
	events = nil
	rec := send(h, "", "")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("with the slot taken: %d, want 429", rec.Code)
	}
	if err := checkFields(rec.Header(), "conc"); err != nil {
		t.Error(err)
	}
	if p := problemOf(t, rec); fmt.Sprint(p["violated-policies"]) != "[conc]" || !strings.Contains(fmt.Sprint(p["detail"]), "allows 1 requests in flight at once") {
		t.Errorf("problem %v", p)
	}
	if ra := rec.Header().Get("Retry-After"); ra != "30" {
		t.Errorf("Retry-After %q, want 30: the other lease expires in 30 s on the frozen clock", ra)
	}
	for _, k := range []string{rule.First.Key, second.Key} {
		if got := hashOf(t, c, k); fmt.Sprint(got) != fmt.Sprint(before[k]) {
			t.Errorf("%s: %v after the slot's refusal, was %v", k, got, before[k])
		}
	}
	if len(events) != 1 || events[0].Outcome != admithttp.Refused || events[0].Lease == nil || events[0].Lease.Denied != admit.PartSlot {
		t.Errorf("events %+v; want one Refused whose Lease names the slot", events)
	}
	if _, err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A bucket refuses (the shared one, emptied): no slot stays taken,
	// and the first bucket is not charged either.
	if _, err := admit.New(c).AllowAll(ctx, admit.Request{Key: second.Key, Spec: sharedSpec, Cost: sharedSpec.Burst() - 1}, nil); err != nil {
		t.Fatal(err)
	}
	before[rule.First.Key] = hashOf(t, c, rule.First.Key)
	events = nil
	rec = send(h, "", "")
	if p := problemOf(t, rec); rec.Code != http.StatusTooManyRequests || fmt.Sprint(p["violated-policies"]) != "[shared]" {
		t.Fatalf("shared bucket empty: %d %v", rec.Code, p)
	}
	if err := checkFields(rec.Header(), "shared"); err != nil {
		t.Error(err)
	}
	if got := rec.Header().Get(admithttp.LimitField); !strings.HasPrefix(got, `"conc";r=1, `) {
		t.Errorf("RateLimit %q: the slot was free and is free again (r = q, no t)", got)
	}
	if got := holders(t, c, rule.Concurrent.Key); got != 0 {
		t.Errorf("%d slots taken after a bucket's refusal", got)
	}
	if got := hashOf(t, c, rule.First.Key); fmt.Sprint(got) != fmt.Sprint(before[rule.First.Key]) {
		t.Errorf("first bucket %v after the second's refusal, was %v", got, before[rule.First.Key])
	}
	if len(events) != 1 || events[0].Outcome != admithttp.Refused || events[0].Lease.Denied != admit.PartSecond || events[0].Decision.Denied != 2 {
		t.Errorf("events %+v; want one Refused by the second bucket", events)
	}
}

// hashOf is the hash at key, every field.
func hashOf(t *testing.T, c valkey.Client, key string) map[string]string {
	t.Helper()
	m, err := c.Do(context.Background(), c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		t.Fatalf("HGETALL %s: %v", key, err)
	}
	return m
}

// TestConcurrentOnly: a Rule with a concurrency part and no bucket is a
// plain concurrency limit; its fields describe the slots alone.
func TestConcurrentOnly(t *testing.T) {
	_, c := newMini(t)
	rule := admithttp.Rule{Concurrent: &admithttp.Concurrent{Policy: "inflight", Key: "only:{org}:conc", Spec: admit.MustConcurrency(2, 10*time.Second)}}
	var inside http.Header
	var admission admithttp.Admission
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll, admithttp.WithHeaders())(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inside = w.Header().Clone()
			admission, _ = admithttp.FromContext(r.Context())
		}))
	if rec := send(h, "", ""); rec.Code != http.StatusOK {
		t.Fatalf("%d", rec.Code)
	}
	if got, want := inside.Get(admithttp.PolicyField), `"inflight";q=2;qu="concurrent-requests"`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got, want := inside.Get(admithttp.LimitField), `"inflight";r=1;t=10`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	if err := checkFields(inside, ""); err != nil {
		t.Error(err)
	}
	if admission.Lease == nil || !admission.Lease.Granted() || admission.Lease.Holders != 1 || !admission.Decision.Allowed() {
		t.Errorf("Admission %+v; want the granted Lease and an Allowed Decision", admission)
	}
	if f, s := rule.Requests(); f != (admit.Request{}) || s != nil {
		t.Errorf("Requests of a Rule without a bucket: %v %v", f, s)
	}
	if got := holders(t, c, "only:{org}:conc"); got != 0 {
		t.Errorf("%d slots taken after the handler returned", got)
	}
}

// TestConcurrentInvalid: a concurrency part without a Key, a Policy or a
// Spec, with a policy name a bucket has, a shadow key, or the key of a
// bucket is an invalid Rule: 500, the handler never runs, nothing is
// written; and it is never the zero Rule's "no limit".
func TestConcurrentInvalid(t *testing.T) {
	srv, c := newMini(t)
	base := concRule("bad:", concSpec, wideSpec)
	for _, tc := range []struct {
		name string
		edit func(r *admithttp.Rule)
	}{
		{"empty key", func(r *admithttp.Rule) { r.Concurrent.Key = "" }},
		{"empty policy", func(r *admithttp.Rule) { r.Concurrent.Policy = "" }},
		{"zero spec", func(r *admithttp.Rule) { r.Concurrent.Spec = admit.Concurrency{} }},
		{"a bucket's policy", func(r *admithttp.Rule) { r.Concurrent.Policy = "tpm" }},
		{"policy not ASCII", func(r *admithttp.Rule) { r.Concurrent.Policy = "c\x00" }},
		{"shadow key", func(r *admithttp.Rule) { r.Concurrent.Key = admithttp.ShadowPrefix + "x" }},
		{"a bucket's key", func(r *admithttp.Rule) { r.Concurrent.Key = r.First.Key }},
		{"empty and alone", func(r *admithttp.Rule) { r.First = admithttp.Bucket{}; r.Concurrent.Key = "" }},
		{"second without first", func(r *admithttp.Rule) { r.Second = &r.First; r.First = admithttp.Bucket{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rule := base
			part := *base.Concurrent
			rule.Concurrent = &part
			tc.edit(&rule)
			next := &recordingHandler{}
			var errs []error
			h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll,
				admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))(next)
			rec := send(h, "", "")
			if rec.Code != http.StatusInternalServerError || next.calls != 0 {
				t.Errorf("%d, handler ran %d times; want 500 and never", rec.Code, next.calls)
			}
			if len(errs) != 1 || !errors.Is(errs[0], admit.ErrInvalidRequest) {
				t.Errorf("errors %v; want one ErrInvalidRequest", errs)
			}
		})
	}
	if keys := srv.Keys(); len(keys) != 0 {
		t.Errorf("keys written: %v", keys)
	}
}

// TestConcurrentReleaseReported: a release that fails (the store went
// down while the handler ran) and a lease found expired at release (the
// handler outlived it) go to the error hook; neither crashes nor changes
// the handler's answer.
func TestConcurrentReleaseReported(t *testing.T) {
	for _, tc := range []struct {
		name   string
		during func(srv interface{ Close() }, setTime func(time.Time))
		want   string
	}{
		{"store down", func(srv interface{ Close() }, _ func(time.Time)) { srv.Close() }, "releasing the slot"},
		{"lease expired", func(_ interface{ Close() }, setTime func(time.Time)) { setTime(t0.Add(31 * time.Second)) }, "had expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, c := newMini(t)
			rule := concRule("release:", concSpec, wideSpec)
			var errs []error
			h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll,
				admithttp.WithDecisionTimeout(200*time.Millisecond),
				admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					tc.during(srv, srv.SetTime)
					io.WriteString(w, "ok")
				}))
			rec := send(h, "", "")
			if rec.Code != http.StatusOK || rec.Body.String() != "ok" {
				t.Errorf("%d %q; want the handler's 200", rec.Code, rec.Body.String())
			}
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
				t.Errorf("errors reported %v; want one saying %q", errs, tc.want)
			}
		})
	}
}

// TestConcurrentDegrade: while the store is down, Degrade decides the
// buckets locally and does not enforce the concurrency part (admit's
// Degraded holds no leases): a Rule of slots alone is served, and the
// fields describe the buckets only.
func TestConcurrentDegrade(t *testing.T) {
	srv, c := newMini(t)
	g, err := admit.NewDegraded(0.5, 64)
	if err != nil {
		t.Fatal(err)
	}
	one := admit.MustConcurrency(1, 30*time.Second)
	withBucket := concRule("degrade:", one, standardSpec) // burst 6, 3 when scaled
	alone := admithttp.Rule{Concurrent: withBucket.Concurrent}
	var flight inFlight
	rule := withBucket
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule },
		admithttp.Outage{NotExecuted: admithttp.Degrade(g), OutcomeUnknown: admithttp.Degrade(g)}, admithttp.WithHeaders())(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { flight.enter(); flight.leave() }))
	srv.Close()
	codes := map[int]int{}
	for i := range 5 {
		rec := send(h, "", "")
		codes[rec.Code]++
		violated := ""
		if rec.Code == http.StatusTooManyRequests {
			violated = "tpm"
		}
		if err := checkFields(rec.Header(), violated); err != nil {
			t.Errorf("request %d: %v", i, err)
		}
		if p := rec.Header().Get(admithttp.PolicyField); strings.Contains(p, "conc") {
			t.Errorf("request %d: RateLimit-Policy %q lists the concurrency part, which is not enforced while degraded", i, p)
		}
	}
	if codes[200] != 3 || codes[429] != 2 {
		t.Errorf("degraded, with a bucket of 3: %v; want 3 served, 2 refused", codes)
	}
	rule = alone
	if rec := send(h, "", ""); rec.Code != http.StatusOK || rec.Header().Get(admithttp.PolicyField) != "" {
		t.Errorf("degraded, slots alone: %d %v; want served without fields", rec.Code, rec.Header())
	}
}

// TestConcurrentClientGoneFreesSlot: a client that goes away while its
// handler runs (net/http cancels the request's context) still has its slot
// freed when the handler returns.
func TestConcurrentClientGoneFreesSlot(t *testing.T) {
	_, c := newMini(t)
	rule := concRule("gone:", concSpec, wideSpec)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errs []error
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll,
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cancel() // the client goes away
			<-r.Context().Done()
		}))
	sendCtx(ctx, h, "", "")
	if got := holders(t, c, rule.Concurrent.Key); got != 0 {
		t.Errorf("%d slots taken after the handler of a gone client returned", got)
	}
	if len(errs) != 0 {
		t.Errorf("errors reported: %v", errs)
	}
}

// TestConcurrentHostileKeys: a concurrency key built with admit.KeyPart
// from a header that is missing, empty, a megabyte long, full of braces or
// of binary bytes keeps its limit: with the one slot taken, the request is
// refused (never admitted, never a 5xx); with it free, admitted. A key
// built from the raw header instead is an invalid Rule (500) when the
// header is missing or too long: never unlimited.
func TestConcurrentHostileKeys(t *testing.T) {
	_, c := newMini(t)
	lim := admit.New(c)
	one := admit.MustConcurrency(1, 30*time.Second)
	keyOf := func(v string) string { return "conc:{" + admit.KeyPart(v) + "}" }
	hostile := []struct {
		name  string
		value *string
	}{
		{"missing", nil}, {"empty", ptr("")}, {"1 MB", ptr(strings.Repeat("x", 1<<20))},
		{"braces", ptr("}{org}{")}, {"binary", ptr("\x00\xff\r\n:{")},
	}
	for _, raw := range []bool{false, true} {
		h := mustNew(t, lim, func(r *http.Request) admithttp.Rule {
			v := r.Header.Get("X-Org")
			key := keyOf(v)
			if raw {
				key = v
			}
			return admithttp.Rule{Concurrent: &admithttp.Concurrent{Policy: "inflight", Key: key, Spec: one}}
		}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Serve})(&recordingHandler{})
		for _, tc := range hostile {
			req := func() int {
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				if tc.value != nil {
					r.Header[http.CanonicalHeaderKey("X-Org")] = []string{*tc.value}
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				return rec.Code
			}
			v := ""
			if tc.value != nil {
				v = *tc.value
			}
			if raw {
				if (v == "" || len(v) > admit.MaxKeyLen) && req() != http.StatusInternalServerError {
					t.Errorf("raw %s: not an invalid Rule", tc.name)
				}
				continue
			}
			x, err := lim.Acquire(context.Background(), admit.Slot{Key: keyOf(v), Spec: one}, nil, nil)
			if err != nil || !x.Granted() {
				t.Fatalf("%s: Acquire %v %v", tc.name, x, err)
			}
			if code := req(); code != http.StatusTooManyRequests {
				t.Errorf("%s: %d with the one slot taken; want 429", tc.name, code)
			}
			if _, err := x.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			if code := req(); code != http.StatusOK {
				t.Errorf("%s: %d with the slot free; want 200", tc.name, code)
			}
		}
	}
}

func ptr(s string) *string { return &s }

// TestConcurrentOutage: with the store down, Serve and Refuse answer a
// Rule with a concurrency part as any other. An Acquire lost in flight
// (outcome unknown: the client may use its dying connection first) may
// have taken a slot, so the middleware tries to release it, and reports
// that release's failure too; an Acquire that was not executed sent
// nothing, so there is nothing to release and no second error.
func TestConcurrentOutage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler admithttp.OutageHandler
		code    int
		outcome admithttp.Outcome
	}{
		{"serve", admithttp.Serve, http.StatusOK, admithttp.OutageServed},
		{"refuse", admithttp.Refuse, http.StatusServiceUnavailable, admithttp.OutageRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, c := newMini(t)
			var errs []error
			var events []admithttp.Event
			next := &recordingHandler{}
			h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return concRule("outage:", concSpec, wideSpec) },
				admithttp.Outage{NotExecuted: tc.handler, OutcomeUnknown: admithttp.Refuse},
				admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }),
				admithttp.WithOutcome(func(e admithttp.Event) { events = append(events, e) }))(next)
			srv.Close()
			for i := range 20 {
				errs, events = nil, nil
				rec := send(h, "", "")
				if len(errs) == 0 {
					t.Fatalf("request %d: %d with no error reported", i, rec.Code)
				}
				if errors.Is(errs[0], admit.ErrOutcomeUnknown) {
					if rec.Code != http.StatusServiceUnavailable || len(errs) != 2 || !strings.Contains(errs[1].Error(), "releasing the slot") {
						t.Errorf("request %d, outcome unknown: %d, errors %v; want 503 and the failed release reported", i, rec.Code, errs)
					}
					continue
				}
				if rec.Code != tc.code || next.admitted {
					t.Errorf("%d (admission %v); want %d without an Admission", rec.Code, next.admitted, tc.code)
				}
				if len(errs) != 1 || !errors.Is(errs[0], admit.ErrNotExecuted) {
					t.Errorf("errors %v; want the one not-executed Acquire", errs)
				}
				if len(events) != 1 || events[0].Outcome != tc.outcome {
					t.Errorf("events %+v; want one %v", events, tc.outcome)
				}
				return
			}
			t.Fatal("no decision was not executed in 20 requests to a closed store")
		})
	}
}
