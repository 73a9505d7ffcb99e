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
	"github.com/valkey-io/valkey-go"
)

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
	u.srv.FlushAll()
	u.now = diffEpoch
	u.srv.SetTime(u.now)
	keys := []string{"b:{x}:a", "b:{x}:b", "b:{x}:c"}
	specs := map[string][2]admit.Spec{}
	for _, k := range keys {
		var pair [2]admit.Spec
		for i := range pair {
			pair[i] = admit.MustSpec(admit.Every(time.Duration(1000+rng.Int64N(2_000_000))*time.Microsecond), 1+rng.IntN(12))
		}
		specs[k] = pair
	}
	current := map[string]int{}
	states := map[string]model.State{}
	ttls := map[string]time.Duration{}
	var lastRetry time.Duration
	var history []string
	counts := map[string]int{}
	for step := range steps {
		iv := specs[keys[rng.IntN(3)]][0].Interval()
		var adv time.Duration
		switch x := rng.IntN(100); {
		case x < 15:
		case x < 45:
			adv = time.Duration(rng.Int64N(int64(iv)*3 + 1))
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
		if adv > 0 {
			for k, ttl := range ttls {
				if ttls[k] = ttl - adv; ttls[k] <= 0 {
					delete(ttls, k)
					delete(states, k)
				}
			}
		}
		if rng.IntN(100) < 3 {
			k := keys[rng.IntN(3)]
			current[k] = 1 - current[k]
		}
		req := func(k string) admit.Request {
			s := specs[k][current[k]]
			return admit.Request{Key: k, Spec: s, Cost: rng.IntN(s.Burst() + 1)} // 0 means 1
		}
		i, j := rng.IntN(3), rng.IntN(3)
		first, second := req(keys[i]), (*admit.Request)(nil)
		if i != j && rng.IntN(3) > 0 {
			r := req(keys[j])
			second = &r
		}
		call := []string{"AllowOrdered", "AllowOrdered", "Peek", "Refund"}[rng.IntN(4)]
		counts[call]++
		desc := fmt.Sprintf("step %d: clock %+v, %s %s (cost %d)", step, adv, call, first.Key, first.Cost)
		if second != nil {
			desc += fmt.Sprintf(" then %s (cost %d)", second.Key, second.Cost)
		}
		history = append(history, desc)
		if len(history) > 6 {
			history = history[1:]
		}
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
			want, writes := model.Decide(u.micros(), states, first, second)
			if call == "AllowOrdered" {
				for k, w := range writes {
					ttl := time.Duration(w.ExpireAtMs*1000-u.micros()) * time.Microsecond
					if w.Keep { // a denial: fields as stored, the expiry only lengthened
						ttls[k] = max(ttls[k], ttl)
						continue
					}
					states[k] = model.State{Tokens: w.Tokens, TS: w.TS}
					ttls[k] = ttl
				}
			}
			lastRetry = got.RetryAfter
			if got.Denied != want.Denied || got.RetryAfter != want.RetryAfter || got.Remaining != want.Remaining || got.Allowed() != (want.Denied == 0) {
				diffs = append(diffs, fmt.Sprintf("decision %v %v, model denied %d retry %v remaining %v", got, got.Remaining, want.Denied, want.RetryAfter, want.Remaining))
			}
		case "Refund":
			if err := u.l.Refund(ctx, first, second); err != nil {
				return fmt.Errorf("%s: %w", desc, err)
			}
			reqs := []admit.Request{first}
			if second != nil {
				reqs = append(reqs, *second)
			}
			for k, w := range model.Refund(u.micros(), states, reqs...) {
				states[k] = model.State{Tokens: w.Tokens, TS: w.TS}
				ttls[k] = time.Duration(w.ExpireAtMs*1000-u.micros()) * time.Microsecond
			}
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
	for _, call := range []string{"AllowOrdered", "Peek", "Refund"} {
		if counts[call] < steps/8 {
			return fmt.Errorf("only %d %s calls in %d steps", counts[call], call, steps)
		}
	}
	return nil
}
