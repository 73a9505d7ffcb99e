package admit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/model"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// TestDifferential drives the shipped script on a miniredis whose clock the
// test sets and the pure-Go model (internal/model) with the same seeded
// random schedule of calls, clock steps (backwards ones included) and Spec
// changes, and requires them to agree decision for decision, RetryAfter
// included, and on every stored field and TTL. A real server's clock cannot
// be stepped, so this is a unit test; admittest compares the real server
// with the same model on seeded states (bucket-states and others).
func TestDifferential(t *testing.T) {
	srv, c := openMini(t)
	u := &miniEnv{srv: srv, l: admit.New(c)}
	for seed := uint64(1); seed <= 3; seed++ {
		if err := differential(context.Background(), u, seed, 800); err != nil {
			t.Errorf("seed %d: %v", seed, err)
		}
	}
}

// openMini starts a miniredis whose TTLs follow its clock, and a client to
// it, both closed at the end of the test.
func openMini(t *testing.T) (*miniredis.Miniredis, valkey.Client) {
	t.Helper()
	srv := miniredis.RunT(t)
	srv.ClockTTL(true)
	// miniredis answers CLUSTER SLOTS: ForceSingleClient keeps it standalone.
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return srv, c
}

// diffEpoch is the miniredis clock at the start of each schedule: years
// from the host clock.
var diffEpoch = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// miniEnv is a miniredis whose clock moves only when the test moves it,
// with a Limiter on it.
type miniEnv struct {
	srv *miniredis.Miniredis
	l   *admit.Limiter
	now time.Time
}

func (e *miniEnv) advance(d time.Duration) {
	e.now = e.now.Add(d)
	e.srv.SetTime(e.now)
}

func (e *miniEnv) micros() int64 { return e.now.UnixMicro() }

// state returns a bucket's raw fields, "" when absent.
func (e *miniEnv) state(key string) (tokens, ts string) {
	if !e.srv.Exists(key) {
		return "", ""
	}
	return e.srv.HGet(key, "tokens"), e.srv.HGet(key, "ts")
}

func differential(ctx context.Context, u *miniEnv, seed uint64, steps int) error {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	u.srv.FlushAll()
	u.now = diffEpoch
	u.srv.SetTime(u.now)
	keys := []string{"d:{x}:a", "d:{x}:b", "d:{x}:c"}
	specs := map[string][2]admit.Spec{}
	for _, k := range keys {
		var pair [2]admit.Spec
		for i := range pair {
			pair[i] = admit.MustSpec(admit.Every(time.Duration(1000+rng.Int64N(2_000_000))*time.Microsecond), 1+rng.IntN(5))
		}
		specs[k] = pair
	}
	current := map[string]int{} // which of a key's two Specs is deployed
	states := map[string]model.State{}
	ttls := map[string]time.Duration{}
	var lastRetry time.Duration
	var history []string
	for step := range steps {
		// The clock: mostly forward by up to an interval, sometimes exactly
		// to the next token (or 1 µs short), sometimes far, sometimes back.
		iv := specs[keys[rng.IntN(3)]][0].Interval()
		var adv time.Duration
		switch x := rng.IntN(100); {
		case x < 15:
		case x < 45:
			adv = time.Duration(rng.Int64N(int64(iv)/2 + 1))
		case x < 60 && lastRetry > 0:
			adv = lastRetry - time.Duration(rng.IntN(2))*time.Microsecond
		case x < 70:
			adv = time.Duration(rng.Int64N(int64(iv) * 15))
		case x < 78:
			adv = -time.Duration(rng.Int64N(int64(2 * time.Second)))
		default:
			adv = time.Duration(rng.Int64N(int64(2 * iv)))
		}
		adv = adv.Truncate(time.Microsecond)
		u.advance(adv)
		if adv > 0 { // miniredis, like Valkey, counts TTLs down only as the clock moves on
			for k, ttl := range ttls {
				if ttls[k] = ttl - adv; ttls[k] <= 0 {
					delete(ttls, k)
					delete(states, k)
				}
			}
		}
		if rng.IntN(100) < 3 { // a deploy changes one bucket's admit.Spec
			k := keys[rng.IntN(3)]
			current[k] = 1 - current[k]
		}
		req := func(k string) admit.Request { return admit.Request{Key: k, Spec: specs[k][current[k]]} }
		i, j := rng.IntN(3), rng.IntN(3)
		first, second := req(keys[i]), (*admit.Request)(nil)
		if i != j && rng.IntN(3) > 0 {
			r := req(keys[j])
			second = &r
		}
		desc := fmt.Sprintf("step %d: clock %+v, call %s", step, adv, first.Key)
		if second != nil {
			desc += " then " + second.Key
		}
		history = append(history, desc)
		if len(history) > 6 {
			history = history[1:]
		}
		got, err := u.l.AllowOrdered(ctx, first, second)
		if err != nil {
			return fmt.Errorf("%s: %w", desc, err)
		}
		want, writes := model.Decide(u.micros(), states, first, second)
		for k, w := range writes {
			ttl := time.Duration(w.ExpireAtMs*1000-u.micros()) * time.Microsecond
			if w.Keep { // a denial: fields as stored, the expiry only lengthened
				ttls[k] = max(ttls[k], ttl)
				continue
			}
			states[k] = model.State{Tokens: w.Tokens, TS: w.TS}
			ttls[k] = ttl
		}
		lastRetry = got.RetryAfter
		var diffs []string
		// The model's Decision is built outside package admit (its Allowed
		// is false): compare the fields, and Allowed with Denied.
		if got.Denied != want.Denied || got.RetryAfter != want.RetryAfter || got.Remaining != want.Remaining || got.Allowed() != (want.Denied == 0) {
			diffs = append(diffs, fmt.Sprintf("decision %v %v, model denied %d retry %v remaining %v", got, got.Remaining, want.Denied, want.RetryAfter, want.Remaining))
		}
		for _, k := range keys {
			tk, ts := u.state(k)
			st, ok := states[k]
			wantTk, wantTs := "", ""
			if ok {
				wantTk, wantTs = strconv.FormatInt(st.Tokens, 10), strconv.FormatInt(st.TS, 10)
			}
			if tk != wantTk || ts != wantTs || u.srv.TTL(k) != ttls[k] {
				diffs = append(diffs, fmt.Sprintf("%s: tokens %q ts %q TTL %v, model %q %q %v", k, tk, ts, u.srv.TTL(k), wantTk, wantTs, ttls[k]))
			}
		}
		if len(diffs) > 0 {
			return fmt.Errorf("the script and the model disagree after:\n\t%s\n%s", strings.Join(history, "\n\t"), strings.Join(diffs, "\n"))
		}
	}
	return nil
}
