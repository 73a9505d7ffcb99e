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
	s := newSchedule(u, rng, "d:{x}:", 5, 1, 2)
	for step := range steps {
		adv := s.tick()
		first, second := s.pick(func(k string) admit.Request { return admit.Request{Key: k, Spec: s.deployed(k)} })
		desc := fmt.Sprintf("step %d: clock %+v, call %s", step, adv, first.Key)
		if second != nil {
			desc += " then " + second.Key
		}
		s.note(desc)
		got, err := u.l.AllowOrdered(ctx, first, second)
		if err != nil {
			return fmt.Errorf("%s: %w", desc, err)
		}
		want, writes := model.Decide(u.micros(), s.states, first, second)
		s.wrote(writes)
		if err := s.check(s.compare(got, want)); err != nil {
			return err
		}
	}
	return nil
}

// schedule is what the differential tests share: three keys under one hash
// tag, two Specs a key (a deploy switches between them now and then), a
// clock that the schedule moves, what the model says every key holds
// (fields and TTL), and the last steps, for a failure's message.
type schedule struct {
	u         *miniEnv
	rng       *rand.Rand
	keys      []string
	specs     map[string][2]admit.Spec
	current   map[string]int // which of a key's two Specs is deployed
	states    map[string]model.State
	ttls      map[string]time.Duration
	lastRetry time.Duration // the last Decision's, a moment worth stepping to
	history   []string
	// A short step forward is up to num/den of an interval.
	num, den int64
}

// newSchedule flushes u, sets its clock to diffEpoch and draws each key's
// two Specs: 1 ms to 2 s an interval, burst 1 to maxBurst.
func newSchedule(u *miniEnv, rng *rand.Rand, prefix string, maxBurst int, num, den int64) *schedule {
	u.srv.FlushAll()
	u.now = diffEpoch
	u.srv.SetTime(u.now)
	s := &schedule{
		u: u, rng: rng, keys: []string{prefix + "a", prefix + "b", prefix + "c"},
		specs: map[string][2]admit.Spec{}, current: map[string]int{},
		states: map[string]model.State{}, ttls: map[string]time.Duration{},
		num: num, den: den,
	}
	for _, k := range s.keys {
		var pair [2]admit.Spec
		for i := range pair {
			pair[i] = admit.MustSpec(admit.Every(time.Duration(1000+rng.Int64N(2_000_000))*time.Microsecond), 1+rng.IntN(maxBurst))
		}
		s.specs[k] = pair
	}
	return s
}

// deployed is the Spec key has now.
func (s *schedule) deployed(key string) admit.Spec { return s.specs[key][s.current[key]] }

// tick moves the clock, mostly forward by up to a short step, sometimes
// exactly to the last RetryAfter (or 1 µs short), sometimes far, sometimes
// back; forgets the keys the model says expired; and now and then deploys
// one key's other Spec. It returns the clock's step.
func (s *schedule) tick() time.Duration {
	rng := s.rng
	iv := s.specs[s.keys[rng.IntN(3)]][0].Interval()
	var adv time.Duration
	switch x := rng.IntN(100); {
	case x < 15:
	case x < 45:
		adv = time.Duration(rng.Int64N(int64(iv)*s.num/s.den + 1))
	case x < 60 && s.lastRetry > 0:
		adv = s.lastRetry - time.Duration(rng.IntN(2))*time.Microsecond
	case x < 70:
		adv = time.Duration(rng.Int64N(int64(iv) * 15))
	case x < 78:
		adv = -time.Duration(rng.Int64N(int64(2 * time.Second)))
	default:
		adv = time.Duration(rng.Int64N(int64(2 * iv)))
	}
	adv = adv.Truncate(time.Microsecond)
	s.u.advance(adv)
	if adv > 0 { // miniredis, like Valkey, counts TTLs down only as the clock moves on
		for k, ttl := range s.ttls {
			if s.ttls[k] = ttl - adv; s.ttls[k] <= 0 {
				delete(s.ttls, k)
				delete(s.states, k)
			}
		}
	}
	if rng.IntN(100) < 3 { // a deploy changes one bucket's admit.Spec
		k := s.keys[rng.IntN(3)]
		s.current[k] = 1 - s.current[k]
	}
	return adv
}

// pick draws a first request and, two times in three, a second on another
// key, each built by req.
func (s *schedule) pick(req func(key string) admit.Request) (admit.Request, *admit.Request) {
	i, j := s.rng.IntN(3), s.rng.IntN(3)
	first, second := req(s.keys[i]), (*admit.Request)(nil)
	if i != j && s.rng.IntN(3) > 0 {
		r := req(s.keys[j])
		second = &r
	}
	return first, second
}

// note records desc as the latest step.
func (s *schedule) note(desc string) {
	if s.history = append(s.history, desc); len(s.history) > 6 {
		s.history = s.history[1:]
	}
}

// wrote applies a decision's or a refund's writes to the model.
func (s *schedule) wrote(writes map[string]model.Write) {
	for k, w := range writes {
		ttl := time.Duration(w.ExpireAtMs*1000-s.u.micros()) * time.Microsecond
		if w.Keep { // a denial: fields as stored, the expiry only lengthened
			s.ttls[k] = max(s.ttls[k], ttl)
			continue
		}
		s.states[k] = model.State{Tokens: w.Tokens, TS: w.TS}
		s.ttls[k] = ttl
	}
}

// compare compares the script's Decision with the model's, and remembers
// its RetryAfter as a moment worth stepping to. The model's Decision is
// built outside package admit (its Allowed is false): compare the fields,
// and Allowed with Denied.
func (s *schedule) compare(got, want admit.Decision) (diffs []string) {
	s.lastRetry = got.RetryAfter
	if got.Denied != want.Denied || got.RetryAfter != want.RetryAfter || got.Remaining != want.Remaining || got.Allowed() != (want.Denied == 0) {
		diffs = append(diffs, fmt.Sprintf("decision %v %v, model denied %d retry %v remaining %v", got, got.Remaining, want.Denied, want.RetryAfter, want.Remaining))
	}
	return diffs
}

// check compares every key's fields and TTL with the model's and returns,
// with diffs, the error that shows the last steps; nil when all agree.
func (s *schedule) check(diffs []string) error {
	for _, k := range s.keys {
		tk, ts := s.u.state(k)
		st, ok := s.states[k]
		wantTk, wantTs := "", ""
		if ok {
			wantTk, wantTs = strconv.FormatInt(st.Tokens, 10), strconv.FormatInt(st.TS, 10)
		}
		if tk != wantTk || ts != wantTs || s.u.srv.TTL(k) != s.ttls[k] {
			diffs = append(diffs, fmt.Sprintf("%s: tokens %q ts %q TTL %v, model %q %q %v", k, tk, ts, s.u.srv.TTL(k), wantTk, wantTs, s.ttls[k]))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("the script and the model disagree after:\n\t%s\n%s", strings.Join(s.history, "\n\t"), strings.Join(diffs, "\n"))
	}
	return nil
}

// TestDifferentialBudget is TestDifferential for the Budget API: a seeded
// random schedule of AllowOrdered, Peek and Refund calls with random Costs
// (0 to the burst), clock steps (backwards ones included) and Spec changes,
// run by the shipped script on a miniredis whose clock the test sets and by
// the model (model.Decide, model.Refund), which must agree on every
// Decision (Denied, RetryAfter, Remaining), every stored field and TTL; a
// Peek must leave every key as it was.
func TestDifferentialBudget(t *testing.T) {
	srv, c := openMini(t)
	u := &miniEnv{srv: srv, l: admit.New(readWriteScripts{c})}
	for seed := uint64(1); seed <= 3; seed++ {
		if err := differentialBudget(context.Background(), u, seed, 800); err != nil {
			t.Errorf("seed %d: %v", seed, err)
		}
	}
}

// readWriteScripts sends EVALSHA_RO and EVAL_RO as EVALSHA and EVAL:
// miniredis (v2.40.0) does not count TIME as a read-only command, so it
// refuses the script's TIME inside a read-only script. The script runs
// unchanged, in peek mode; the test checks that a peek writes nothing.
type readWriteScripts struct{ valkey.Client }

func (c readWriteScripts) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	args := cmd.Commands()
	if len(args) >= 3 && (strings.EqualFold(args[0], "EVALSHA_RO") || strings.EqualFold(args[0], "EVAL_RO")) {
		n, _ := strconv.Atoi(args[2])
		name := strings.TrimSuffix(strings.ToUpper(args[0]), "_RO")
		cmd = c.B().Arbitrary(name).Args(args[1], args[2]).Keys(args[3 : 3+n]...).Args(args[3+n:]...).Build()
	}
	return c.Client.Do(ctx, cmd)
}

func differentialBudget(ctx context.Context, u *miniEnv, seed uint64, steps int) error {
	rng := rand.New(rand.NewPCG(seed, 0xb0d9e7))
	s := newSchedule(u, rng, "b:{x}:", 12, 3, 1)
	counts := map[string]int{}
	for step := range steps {
		adv := s.tick()
		first, second := s.pick(func(k string) admit.Request {
			spec := s.deployed(k)
			return admit.Request{Key: k, Spec: spec, Cost: rng.IntN(spec.Burst() + 1)} // 0 means 1
		})
		call := []string{"AllowOrdered", "AllowOrdered", "Peek", "Refund"}[rng.IntN(4)]
		counts[call]++
		desc := fmt.Sprintf("step %d: clock %+v, %s %s (cost %d)", step, adv, call, first.Key, first.Cost)
		if second != nil {
			desc += fmt.Sprintf(" then %s (cost %d)", second.Key, second.Cost)
		}
		s.note(desc)
		var diffs []string
		switch call {
		case "AllowOrdered", "Peek":
			var got admit.Decision
			var err error
			if call == "Peek" {
				got, err = u.l.Peek(ctx, first, second)
			} else {
				got, err = u.l.AllowOrdered(ctx, first, second)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", desc, err)
			}
			want, writes := model.Decide(u.micros(), s.states, first, second)
			if call == "AllowOrdered" { // a peek writes nothing: the model's writes are not applied
				s.wrote(writes)
			}
			diffs = s.compare(got, want)
		case "Refund":
			if err := u.l.Refund(ctx, first, second); err != nil {
				return fmt.Errorf("%s: %w", desc, err)
			}
			reqs := []admit.Request{first}
			if second != nil {
				reqs = append(reqs, *second)
			}
			s.wrote(model.Refund(u.micros(), s.states, reqs...))
		}
		if err := s.check(diffs); err != nil {
			return err
		}
	}
	for _, call := range []string{"AllowOrdered", "Peek", "Refund"} {
		if counts[call] < steps/8 {
			return fmt.Errorf("only %d %s calls in %d steps", counts[call], call, steps)
		}
	}
	return nil
}
