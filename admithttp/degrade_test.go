package admithttp_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/internal/minitest"
)

// TestDegrade: while the store is down, Degrade decides each request in
// the process at the fraction of every Spec (the premium lane's shared
// bucket, burst 20 at 0.25: 5 admitted, then 429s with the scaled fields);
// once the store answers again, the next request is decided there, from a
// full bucket, with nothing carried over.
func TestDegrade(t *testing.T) {
	srv, c := minitest.Start(t)
	g, err := admit.NewDegraded(0.25, 64)
	if err != nil {
		t.Fatal(err)
	}
	var events []admithttp.Event
	h := &recordingHandler{}
	mw := mustNew(t, admit.New(c), lanes("degrade:"),
		admithttp.Outage{NotExecuted: admithttp.Degrade(g), OutcomeUnknown: admithttp.Degrade(g)},
		admithttp.WithHeaders(), admithttp.WithOutcome(func(e admithttp.Event) { events = append(events, e) }))(h)

	scaled, err := g.Scale(sharedSpec)
	if err != nil {
		t.Fatal(err)
	}
	if scaled.Burst() != sharedSpec.Burst()/4 {
		t.Fatalf("scaled burst %d, want a quarter of %d", scaled.Burst(), sharedSpec.Burst())
	}
	srv.Close() // the store is down: every decision fails, not executed

	served := 0
	for i := range scaled.Burst() + 3 {
		rec := send(mw, "premium", "")
		if err := checkFields(rec.Header(), violatedOf(rec)); err != nil {
			t.Errorf("request %d: %v\n%v", i, err, rec.Header())
		}
		switch rec.Code {
		case http.StatusOK:
			served++
			if h.admitted {
				t.Errorf("request %d: a degraded request carries an Admission; there is no store charge to settle", i)
			}
		case http.StatusTooManyRequests:
			if rec.Header().Get("Retry-After") == "" {
				t.Errorf("request %d: a degraded refusal without Retry-After", i)
			}
		default:
			t.Fatalf("request %d: status %d, want 200 or 429", i, rec.Code)
		}
	}
	if served != scaled.Burst() {
		t.Errorf("served %d while the store was down, want the scaled burst %d", served, scaled.Burst())
	}
	served, refused := 0, 0
	for _, e := range events {
		switch e.Outcome {
		case admithttp.OutageServed:
			served++
		case admithttp.OutageRefused:
			refused++
		default:
			t.Errorf("outcome %v while the store was down", e.Outcome)
		}
	}
	if served != scaled.Burst() || refused != 3 {
		t.Errorf("outcomes: %d served, %d refused; want %d and 3", served, refused, scaled.Burst())
	}

	// The store is back: decided there, its bucket full. "Back" is when
	// the client's own PING is answered: the first command after a restart
	// may still meet a connection the server dropped (EOF, outcome unknown).
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	back := false
	for range 100 {
		if back = c.Do(t.Context(), c.B().Ping().Build()).Error() == nil; back {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !back {
		t.Fatal("the restarted store did not answer the client's PING within a second")
	}
	events = nil
	rec := send(mw, "premium", "")
	if rec.Code != http.StatusOK || !h.admitted || len(events) != 1 || events[0].Outcome != admithttp.Admitted {
		t.Fatalf("after the restart: status %d, admission %v, events %v; want the store's admission", rec.Code, h.admitted, events)
	}
	if got, want := h.admission.Decision.Remaining[0], sharedSpec.Burst()-1; got != want {
		t.Errorf("after the restart the store's bucket holds %d, want %d: nothing carries over", got, want)
	}
}

// violatedOf is the policy a refusal names in its RateLimit field: the
// premium lane's only bucket.
func violatedOf(rec interface{ Result() *http.Response }) string {
	if rec.Result().StatusCode == http.StatusTooManyRequests {
		return "shared"
	}
	return ""
}
