package model

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/admitkit/admit"
)

// TestLeaseSteps: the model's leases, step by step: the limit, a refusal's
// wait, a crashed holder freed at expiry, replay, extend and release.
func TestLeaseSteps(t *testing.T) {
	for _, expiry := range []Expiry{Absolute, Countdown} {
		s := NewLeaseServer(epoch, expiry)
		spec := admit.MustConcurrency(2, 10*time.Second)
		slot := func(name string) LeaseRequest { return LeaseRequest{Key: "c", Spec: spec, Name: name} }
		acq := func(step, name string) LeaseOutcome {
			t.Helper()
			o, err := s.Acquire(slot(name), nil, nil)
			if err != nil {
				t.Fatalf("%v step %s: %v", expiry, step, err)
			}
			return o
		}
		if o := acq("a", "a"); !o.Granted || o.Replayed || o.Left != 10*time.Second || o.Holders != 1 {
			t.Errorf("step a: %v", o)
		}
		s.Advance(3 * time.Second)
		if o := acq("b", "b"); !o.Granted || o.Holders != 2 {
			t.Errorf("step b: %v", o)
		}
		// Full: the wait is until a's lease expires, 7 s on.
		if o := acq("c refused", "c"); o.Granted || o.Denied != admit.PartConcurrency || o.RetryAfter != 7*time.Second || o.Holders != 2 {
			t.Errorf("step c: %v, want refused by concurrency, retry after 7s", o)
		}
		// A retry of a under its name: the same lease, nothing taken.
		if o := acq("a again", "a"); !o.Granted || !o.Replayed || o.Left != 7*time.Second || o.Holders != 2 {
			t.Errorf("a again: %v", o)
		}
		// a crashes (never calls again): its slot frees at expiry, not before.
		s.Advance(7*time.Second - time.Microsecond)
		if o := acq("c, 1µs before a expires", "c"); o.Granted {
			t.Errorf("c granted while a is live: %v", o)
		}
		s.Advance(time.Microsecond)
		if o := acq("c at a's expiry", "c"); !o.Granted || o.Holders != 2 {
			t.Errorf("c at a's expiry: %v", o)
		}
		if _, ok := s.Sets["c"].Holders["a"]; ok {
			t.Error("a grant did not prune the expired holder a")
		}
		// Extend renews b to now + 10 s; a's lease cannot be extended.
		if ok, left, err := s.Extend("c", "b", spec); !ok || left != 10*time.Second || err != nil {
			t.Errorf("extend b: %v %v %v", ok, left, err)
		}
		if ok, _, err := s.Extend("c", "a", spec); ok || err != nil {
			t.Errorf("extend of expired a: %v %v", ok, err)
		}
		// Release: idempotent, reports.
		if held, err := s.Release("c", "b"); !held || err != nil {
			t.Errorf("release b: %v %v", held, err)
		}
		if held, err := s.Release("c", "b"); held || err != nil {
			t.Errorf("release b again: %v %v", held, err)
		}
		if ok, _, _ := s.Extend("c", "b", spec); ok {
			t.Error("extend after release granted")
		}
		if s.Live("c") != 1 {
			t.Errorf("%d live, want 1", s.Live("c"))
		}
		if held, _ := s.Release("c", "c"); !held {
			t.Error("release c")
		}
		if _, ok := s.Sets["c"]; ok {
			t.Error("the key outlived its last holder")
		}
	}
}

// TestLeaseAllOrNothing: with buckets, a refusal by any part takes
// nothing; a replay takes nothing.
func TestLeaseAllOrNothing(t *testing.T) {
	s := NewLeaseServer(epoch, Absolute)
	spec := admit.MustConcurrency(1, time.Minute)
	b1 := admit.Request{Key: "b1", Spec: admit.MustSpec(admit.Every(time.Hour), 3)}
	b2 := admit.Request{Key: "b2", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
	o, err := s.Acquire(LeaseRequest{"c", spec, "x"}, &b1, &b2)
	if err != nil || !o.Granted || o.Remaining != [2]int{2, 0} {
		t.Fatalf("first: %v %v", o, err)
	}
	if o, _ := s.Acquire(LeaseRequest{"c", spec, "x"}, &b1, &b2); !o.Replayed || o.Remaining != [2]int{-1, -1} || s.Buckets["b1"].Tokens != 2 {
		t.Errorf("replay: %v, b1 %d", o, s.Buckets["b1"].Tokens)
	}
	before := s.Clone()
	if o, _ := s.Acquire(LeaseRequest{"c", spec, "y"}, &b1, &b2); o.Denied != admit.PartConcurrency {
		t.Errorf("full: %v", o)
	}
	if len(s.Sets["c"].Holders) != len(before.Sets["c"].Holders) || s.Buckets["b1"] != before.Buckets["b1"] || s.Buckets["b2"] != before.Buckets["b2"] {
		t.Error("a refusal by the slot took something")
	}
	if _, err := s.Release("c", "x"); err != nil {
		t.Fatal(err)
	}
	before = s.Clone()
	o, _ = s.Acquire(LeaseRequest{"c", spec, "y"}, &b1, &b2)
	if o.Denied != admit.PartSecond || o.Remaining != [2]int{2, 0} {
		t.Errorf("bucket 2 empty: %v", o)
	}
	if s.Buckets["b1"] != before.Buckets["b1"] || len(s.Sets) != len(before.Sets) {
		t.Errorf("a refusal by bucket 2 took something: b1 %v → %v", before.Buckets["b1"], s.Buckets["b1"])
	}
	if _, err := s.Acquire(LeaseRequest{"b1", spec, "y"}, &b1, nil); !errors.Is(err, admit.ErrInvalidRequest) {
		t.Errorf("slot key = bucket key: %v", err)
	}
	if _, err := s.Acquire(LeaseRequest{"b1", spec, "y"}, nil, nil); !errors.Is(err, admit.ErrWrongType) {
		t.Errorf("slot on a bucket's key: %v", err)
	}
}

// TestLeaseModelNeverOverLimit: random acquires, extends and releases by
// holders that vanish, with clock steps both ways, never leave more than
// the limit live, on either kind of server.
func TestLeaseModelNeverOverLimit(t *testing.T) {
	for _, expiry := range []Expiry{Absolute, Countdown} {
		rng := rand.New(rand.NewPCG(1, uint64(expiry)))
		s := NewLeaseServer(epoch, expiry)
		spec := admit.MustConcurrency(3, 50*time.Millisecond)
		peak, grants := 0, 0
		for i := range 20000 {
			name := strconv.Itoa(rng.IntN(8))
			switch rng.IntN(6) {
			case 0, 1:
				o, err := s.Acquire(LeaseRequest{"c", spec, name}, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if o.Granted && !o.Replayed {
					grants++
				}
			case 2:
				s.Extend("c", name, spec)
			case 3:
				s.Release("c", name)
			case 4:
				s.Advance(time.Duration(rng.IntN(30000)) * time.Microsecond)
			case 5:
				if rng.IntN(20) == 0 {
					s.Advance(-time.Duration(rng.IntN(100)) * time.Millisecond)
				}
			}
			if n := s.Live("c"); n > spec.Limit() {
				t.Fatalf("%v step %d: %d live, limit %d", expiry, i, n, spec.Limit())
			} else {
				peak = max(peak, n)
			}
		}
		if peak != spec.Limit() || grants < 100 {
			t.Errorf("%v: peak %d live, %d grants: the run did not reach the limit", expiry, peak, grants)
		}
	}
}
