package admithttp

import (
	"net/http"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/edge"
)

// Degrade returns an OutageHandler that decides the request's Rule in this
// process, on d, at d's fraction of every Spec, while the store fails: a
// fleet of N processes then admits at most N × fraction × the limit
// (docs/outages.md), instead of every request (Serve) or none (Refuse).
// The decision is all or nothing, as the store's is. An admitted request
// runs the handler, with the fields of its local decision when
// [WithHeaders] is on; a refused one is answered as a store refusal is
// (429, Retry-After, the fields, your [WithRefusal] responder), its
// RateLimit-Policy giving the scaled quota that refused it. Nothing sticks:
// the next request asks the store first, and a request the store answers
// is decided there again. Buckets decided locally do not carry over to the
// store, nor back. A request served this way has no [Admission] in its
// context: there is no store charge to settle.
//
// A Rule with a concurrency part is refused while degraded, as [Refuse]
// refuses it (503, Retry-After of OutageRetryAfter): an [admit.Degraded]
// holds no leases, and a limit of requests in flight counted in each
// process would not bound the fleet. So the bound holds in an outage too:
// no more requests of a key run at once than its limit (none start).
// Rules without a concurrency part are decided locally as above.
//
// Degrade panics if d is nil. Called outside the middleware, or when d
// cannot decide the Rule (a Cost above a scaled burst), it answers as
// [Refuse] does.
func Degrade(d *admit.Degraded) OutageHandler {
	if d == nil {
		panic("admithttp: Degrade(nil): build one with admit.NewDegraded(fraction, maxKeys)")
	}
	return func(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
		o, ok := r.Context().Value(outageKey{}).(*outageCall)
		if !ok {
			Refuse(w, r, next, err)
			return
		}
		if o.rule.Concurrent != nil {
			Refuse(w, r, next, err) // a Degraded holds no leases
			return
		}
		rule := o.rule
		scaled, serr := edge.Scale(d, rule)
		first, second := rule.Requests()
		dec, derr := d.AllowAll(r.Context(), first, second)
		if serr != nil || derr != nil {
			Refuse(w, r, next, err)
			return
		}
		res := edge.Result{Decision: dec}
		if !dec.Allowed() {
			o.m.refuse(w, r, scaled, res)
			return
		}
		o.m.setFields(w.Header(), scaled, res, false)
		next.ServeHTTP(w, r)
	}
}

// outageKey is the context key under which the middleware hands an Outage
// handler the request's Rule.
type outageKey struct{}

// outageCall is what an Outage handler may need beyond its arguments.
type outageCall struct {
	m    *middleware
	rule Rule
}
