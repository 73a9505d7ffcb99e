package worker

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
)

// writes is what a server of the test's own has written: its dirty
// counter (rdb_changes_since_last_save, which counts every change to the
// dataset and nothing that changed none, such as a PEXPIREAT GT that kept
// an expiry) and its number of keys.
type writes struct{ dirty, keys int64 }

func (e *env) writes(t *testing.T) writes {
	t.Helper()
	info, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Info().Section("persistence").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	dirty, err := strconv.ParseInt(testenv.Info(info)["rdb_changes_since_last_save"], 10, 64)
	if err != nil {
		t.Fatalf("INFO persistence: rdb_changes_since_last_save: %v", err)
	}
	keys, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Dbsize().Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return writes{dirty, keys}
}

// TestDeniedMessageWritesNothing: a message refused by its first bucket
// (the standard lane's share, or the shared bucket on the premium lane)
// costs one script run and no Valkey write at all: no once-record (admit
// records only a decision that charged), no bucket change. Its
// redelivery, under the same message id, decides again and is admitted once
// the bucket has room (had the denial been recorded, the server would
// return it to every redelivery for admit.OnceWindow). Measured on a
// server of the test's own, from its dirty counter, its key count and INFO
// commandstats.
func TestDeniedMessageWritesNothing(t *testing.T) {
	srv := testenv.Own(t)
	l := slowChat()
	l.ChatStandard = admit.MustSpec(admit.Every(time.Hour), 1)
	l.ChatShared = admit.MustSpec(admit.Every(time.Hour), 2)
	e := newEnv(t, srv, withLimits(l), withRetryUnknown())
	e.worker.cfg.Lifetime = 2 * time.Hour // RetryAfter is an hour: a nack, not a drop

	for _, c := range []struct {
		lane    limits.Lane
		channel string
		warm    int // messages that empty the first bucket
		class   limits.BucketClass
	}{
		{limits.LaneStandard, "42", 1, limits.ClassStandard}, // the share's one token (the shared bucket keeps one)
		{limits.LanePremium, "43", 2, limits.ClassShared},    // the shared bucket's two
	} {
		t.Run(c.lane.String(), func(t *testing.T) {
			e.seed(t, c.channel, false)
			for range c.warm {
				if p, err := e.process(t, c.lane, chat(c.channel)); err != nil || !p.Admitted {
					t.Fatalf("warm-up: %+v, %v", p, err)
				}
			}
			std, shared := channels.ChatKeys(e.prefix, c.channel)
			key := std
			if c.lane == limits.LanePremium {
				key = shared
			}
			m := e.message(chat(c.channel))
			w0, s0 := e.writes(t), testenv.CommandStats(t, e.raw)
			path, err := e.worker.Process(testenv.Ctx(t), c.lane, m)
			w1, s1 := e.writes(t), testenv.CommandStats(t, e.raw)
			var nack *bus.ExpectedNack
			if !errors.As(err, &nack) || nack.Reason != bus.NackLimited || path.Admitted || path.LimiterCalls != 1 {
				t.Fatalf("path %+v, err %v: want denied in one call and nacked as limited", path, err)
			}
			if got := e.metrics.Denied(c.lane, c.class); got != 1 {
				t.Errorf("%d denials by the %v bucket, want 1", got, c.class)
			}
			if w1 != w0 {
				t.Errorf("the denied message wrote: dirty %d -> %d, keys %d -> %d; want no change", w0.dirty, w1.dirty, w0.keys, w1.keys)
			}
			for _, name := range []string{"set", "hset", "del", "eval"} {
				if n := s1[name].Calls - s0[name].Calls; n != 0 {
					t.Errorf("%d %s during the denied message, want 0", n, name)
				}
			}
			if n := s1["evalsha"].Calls - s0["evalsha"].Calls; n != 1 {
				t.Errorf("%d EVALSHA, want 1: one script run decided", n)
			}
			record, err := admit.OnceRecordKey(key, DecisionID(m))
			if err != nil {
				t.Fatal(err)
			}
			if n, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Exists().Key(record).Build()).AsInt64(); err != nil || n != 0 {
				t.Errorf("EXISTS %s: %d, %v; want no record for a denial", record, n, err)
			}

			// The bucket refills (deleting it stands for that); the
			// redelivery, under the same message id, decides and is admitted.
			if err := e.raw.Do(testenv.Ctx(t), e.raw.B().Del().Key(key).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			m.Attempt++
			path, err = e.worker.Process(testenv.Ctx(t), c.lane, m)
			if err != nil || !path.Admitted || path.LimiterCalls != 1 || path.Redecided {
				t.Errorf("redelivery: path %+v, err %v; want admitted in one call", path, err)
			}
		})
	}
}

// TestRedeliveryAfterSecondBucketDenial: a standard message refused by the
// shared bucket (its share admitted: the share was charged, and admit
// recorded the denial under the message's id) is nacked; its redelivery
// gets the recorded denial back (Replayed), decides afresh under
// RedecisionID and is admitted once the shared bucket has room. Without the
// second decision the message would be refused for admit.OnceWindow, past
// its lifetime.
func TestRedeliveryAfterSecondBucketDenial(t *testing.T) {
	l := slowChat()
	l.ChatShared = admit.MustSpec(admit.Every(time.Hour), 1)
	e := newEnv(t, nil, withLimits(l), withRetryUnknown())
	e.seed(t, "42", false)
	std, shared := channels.ChatKeys(e.prefix, "42")
	if p, err := e.process(t, limits.LanePremium, chat("42")); err != nil || !p.Admitted { // premium takes the shared bucket's one token
		t.Fatalf("premium: %+v, %v", p, err)
	}
	e.worker.cfg.Lifetime = 2 * time.Hour
	m := e.message(chat("42"))
	path, err := e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	var nack *bus.ExpectedNack
	if !errors.As(err, &nack) || nack.Reason != bus.NackLimited || path.Admitted || path.Redecided {
		t.Fatalf("path %+v, err %v: want denied by the shared bucket and nacked", path, err)
	}
	if got := e.metrics.Denied(limits.LaneStandard, limits.ClassShared); got != 1 {
		t.Errorf("%d denials by the shared bucket, want 1", got)
	}
	if a, b := e.tokens(t, std), e.tokens(t, shared); a != "9" || b != "0" {
		t.Errorf("%s and %s tokens, want 9 and 0: the share charged, the shared bucket refused", a, b)
	}
	if err := e.raw.Do(testenv.Ctx(t), e.raw.B().Del().Key(shared).Build()).Error(); err != nil { // the shared bucket refills
		t.Fatal(err)
	}
	m.Attempt++
	path, err = e.worker.Process(testenv.Ctx(t), limits.LaneStandard, m)
	if err != nil || !path.Admitted || !path.Redecided || path.LimiterCalls != 2 {
		t.Fatalf("redelivery: path %+v, err %v; want admitted after the replayed denial and a second decision (2 calls)", path, err)
	}
	if a, b := e.tokens(t, std), e.tokens(t, shared); a != "8" || b != "0" {
		t.Errorf("%s and %s tokens, want 8 and 0", a, b)
	}
	if got := e.metrics.LimiterRedecisions(limits.LaneStandard); got != 1 {
		t.Errorf("%d redecisions, want 1", got)
	}
	record, err := admit.OnceRecordKey(std, RedecisionID(DecisionID(m), 2))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := e.raw.Do(testenv.Ctx(t), e.raw.B().Exists().Key(record).Build()).AsInt64(); err != nil || n != 1 {
		t.Errorf("EXISTS %s: %d, %v; want the second decision recorded under the delivery's id", record, n, err)
	}
}
