package model

import (
	"errors"
	"testing"
	"time"

	"github.com/admitkit/admit"
)

var epoch = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC).UnixMicro()

// TestOnce: the model's once-records, as AllowOrderedOnce's doc defines them.
func TestOnce(t *testing.T) {
	s := NewServer(epoch, Countdown)
	spec := admit.MustSpec(admit.Every(time.Hour), 9)
	r := admit.Request{Key: "job", Spec: spec, Cost: 5}
	o, err := s.AllowOrderedOnce("a", r, nil)
	if err != nil || !o.Allowed || o.Replayed || o.Remaining != [2]int{4, -1} {
		t.Fatalf("first call: %v, %v", o, err)
	}
	o2, err := s.AllowOrderedOnce("a", r, nil)
	if want := (Outcome{Allowed: true, Replayed: true, Remaining: [2]int{4, -1}}); err != nil || o2 != want {
		t.Errorf("retry: %v, %v; want %v", o2, err, want)
	}
	if s.Buckets["job"].Tokens != 4 {
		t.Errorf("the replay charged: %d left", s.Buckets["job"].Tokens)
	}
	if _, err := s.AllowOrderedOnce("a", admit.Request{Key: "job", Spec: spec, Cost: 4}, nil); !errors.Is(err, admit.ErrOnceIDReused) {
		t.Errorf("another Cost: %v, want ErrOnceIDReused", err)
	}
	// A first-bucket denial is not recorded: the same id decides again.
	o, err = s.AllowOrderedOnce("b", r, nil)
	if err != nil || o.Denied != 1 {
		t.Fatalf("on 4 left, cost 5: %v, %v", o, err)
	}
	if _, ok := s.Records[RecordID{"job", "b"}]; ok {
		t.Error("a first-bucket denial was recorded")
	}
	s.Advance(time.Hour)
	if o, err := s.AllowOrderedOnce("b", r, nil); err != nil || !o.Allowed || o.Replayed {
		t.Errorf("the same id an hour later: %v, %v; want a fresh admission", o, err)
	}
	// Records are per (key, id): "{job}" with id "a" is another record.
	if o, err := s.AllowOrderedOnce("a", admit.Request{Key: "{job}", Spec: spec, Cost: 5}, nil); err != nil || o.Replayed {
		t.Errorf("key {job}, id a: %v, %v; want a fresh decision", o, err)
	}
	if _, err := s.AllowOrderedOnce("a", admit.Request{Key: "a}b", Spec: spec}, nil); !errors.Is(err, admit.ErrInvalidRequest) {
		t.Errorf("an untagged key holding }: %v", err)
	}
}

// TestExpiry: a Countdown server keeps every TTL through a clock stepped
// back; an Absolute one keeps every expiry time, and keeps a key through
// the millisecond of its expiry.
func TestExpiry(t *testing.T) {
	spec := admit.MustSpec(admit.Every(time.Millisecond), 2) // TTL 2 ms
	for _, tc := range []struct {
		expiry Expiry
		back   time.Duration
		alive  []time.Duration // clock steps after the step back, and whether the key lives
		want   []bool
	}{
		{Countdown, -time.Second, []time.Duration{1999 * time.Microsecond, time.Microsecond}, []bool{true, false}},
		{Absolute, -time.Second, []time.Duration{time.Second + 1999*time.Microsecond, 999 * time.Microsecond, 2 * time.Microsecond}, []bool{true, true, false}},
	} {
		s := NewServer(epoch, tc.expiry) // a whole millisecond
		if _, err := s.AllowOrdered(admit.Request{Key: "k", Spec: spec}, nil); err != nil {
			t.Fatal(err)
		}
		if got := s.Buckets["k"].ExpireAt; got != epoch+2000 {
			t.Fatalf("%d: expiry %d, want %d", tc.expiry, got, epoch+2000)
		}
		s.Advance(tc.back)
		for i, d := range tc.alive {
			s.Advance(d)
			if _, ok := s.Buckets["k"]; ok != tc.want[i] {
				t.Errorf("expiry rule %d, step %d: key alive %v, want %v", tc.expiry, i, ok, tc.want[i])
			}
		}
	}
}

// TestWaitAttempt: an attempt that the second bucket refuses gives the
// first bucket its Cost back; a second attempt on the same clock changes
// nothing more.
func TestWaitAttempt(t *testing.T) {
	s := NewServer(epoch, Absolute)
	first := admit.Request{Key: "a", Spec: admit.MustSpec(admit.Every(time.Second), 3)}
	second := admit.Request{Key: "b", Spec: admit.MustSpec(admit.Every(time.Second), 1)}
	if _, err := s.AllowOrdered(second, nil); err != nil {
		t.Fatal(err)
	}
	o, err := s.WaitAttempt(first, &second)
	if err != nil || o.Denied != 2 || o.Remaining != [2]int{2, 0} {
		t.Fatalf("%v, %v", o, err)
	}
	after := s.Clone()
	if o2, err := s.WaitAttempt(first, &second); err != nil || o2 != o {
		t.Fatalf("second attempt: %v, %v", o2, err)
	}
	if s.Buckets["a"] != after.Buckets["a"] || s.Buckets["a"].Tokens != 3 {
		t.Errorf("bucket a after two attempts %+v, after one %+v; want 3 tokens, unchanged", s.Buckets["a"], after.Buckets["a"])
	}
}

// TestCachePromise: what a denial cache may answer without the server.
func TestCachePromise(t *testing.T) {
	c := NewCache()
	r := admit.Request{Key: "k", Spec: admit.MustSpec(admit.Every(time.Second), 1)}
	t0 := time.Now()
	deny := Outcome{Denied: 1, RetryAfter: time.Second, Remaining: [2]int{0, -1}}
	if err := c.Check(r, t0, deny); err == nil {
		t.Error("a denial with no server denial before it passed")
	}
	c.Denied(r, t0, deny)
	if err := c.Check(r, t0.Add(time.Millisecond), Outcome{Denied: 1, RetryAfter: 999 * time.Millisecond, Remaining: [2]int{0, -1}}); err != nil {
		t.Errorf("within the window: %v", err)
	}
	for name, tc := range map[string]struct {
		at time.Time
		o  Outcome
	}{
		"after the window": {t0.Add(time.Second), Outcome{Denied: 1, RetryAfter: time.Microsecond, Remaining: [2]int{0, -1}}},
		"RetryAfter long":  {t0.Add(time.Millisecond), deny},
		"an admission":     {t0, Outcome{Allowed: true, Remaining: [2]int{0, -1}}},
		"another cost":     {t0, Outcome{Denied: 1, RetryAfter: time.Millisecond, Remaining: [2]int{1, -1}}},
	} {
		if err := c.Check(r, tc.at, tc.o); err == nil {
			t.Errorf("%s passed", name)
		}
	}
	c.Refunded("k")
	if err := c.Check(r, t0.Add(time.Millisecond), Outcome{Denied: 1, RetryAfter: 999 * time.Millisecond, Remaining: [2]int{0, -1}}); err == nil {
		t.Error("a denial after the Limiter's own Refund passed")
	}
}
