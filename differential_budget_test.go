package admit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

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
