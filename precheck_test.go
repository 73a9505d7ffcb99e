package admit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/mutate"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationPrecheckFailureNotExecuted: an ACL precheck that the
// server raises an error on (here, each check in turn asks about a command
// the server does not have, as a server that validates the check's
// arguments raises on a malformed one) fails the call as ErrNotExecuted
// with the server's text, and every key the call names is byte for byte as
// it was, expiry included (DUMP and PEXPIRETIME before and after).
func TestIntegrationPrecheckFailureNotExecuted(t *testing.T) {
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	p := testserver.Prefix(t, c)
	ctx := context.Background()
	if ok, err := c.Do(ctx, c.B().Eval().Script("return redis.acl_check_cmd ~= nil").Numkeys(0).Build()).AsBool(); err != nil || !ok {
		t.Skipf("the server has no redis.acl_check_cmd (%v): nothing to precheck", err)
	}
	shipped := New(c)
	open, shut := MustSpec(Every(time.Hour), 10), MustSpec(Every(time.Hour), 1)
	conc := MustConcurrency(3, time.Hour)
	for _, tc := range []struct {
		marker string
		keys   []string
		// call runs the check's path; with the shipped Limiter first, to
		// make the keys' state (the once-record and lease cases then take
		// another id or name, so that the broken call is not a replay).
		call func(l *Limiter) error
	}{
		{"acl-store-expire", []string{"{a}1"}, func(l *Limiter) error {
			_, err := l.AllowOrdered(ctx, Request{Key: p + "{a}1", Spec: open}, nil)
			return err
		}},
		{"acl-store-hset", []string{"{b}1", "{b}2"}, func(l *Limiter) error {
			_, err := l.AllowOrdered(ctx, Request{Key: p + "{b}1", Spec: open}, &Request{Key: p + "{b}2", Spec: open})
			return err
		}},
		{"acl-store-expire2", []string{"{c}1", "{c}2"}, func(l *Limiter) error {
			_, err := l.AllowOrdered(ctx, Request{Key: p + "{c}1", Spec: open}, &Request{Key: p + "{c}2", Spec: open})
			return err
		}},
		{"acl-keep-expire", []string{"{d}1", "{d}2"}, func(l *Limiter) error {
			if l == shipped { // bucket 2 empty: the call is a second-bucket denial
				if _, err := l.AllowOrdered(ctx, Request{Key: p + "{d}2", Spec: shut}, nil); err != nil {
					return err
				}
			}
			_, err := l.AllowOrdered(ctx, Request{Key: p + "{d}1", Spec: open}, &Request{Key: p + "{d}2", Spec: shut})
			return err
		}},
		{"acl-record", []string{"{e}1", strings.TrimPrefix(onceRecord(p+"{e}1", "x"), p)}, func(l *Limiter) error {
			id := "x"
			if l == shipped { // another id: the broken call's must be new, not a replay
				id = "seed"
			}
			_, err := l.AllowOrderedOnce(ctx, id, Request{Key: p + "{e}1", Spec: open}, nil)
			return err
		}},
		{"lease-acl-expire", []string{"{f}c"}, func(l *Limiter) error {
			name := "mine"
			if l == shipped {
				name = "other"
			}
			_, err := l.Acquire(ctx, LeaseRequest{Key: p + "{f}c", Spec: conc, Name: name}, nil, nil)
			return err
		}},
		{"lease-acl-extend", []string{"{g}c"}, func(l *Limiter) error {
			if l == shipped {
				_, err := l.Acquire(ctx, LeaseRequest{Key: p + "{g}c", Spec: conc, Name: "mine"}, nil, nil)
				return err
			}
			_, err := l.Lease(LeaseRequest{Key: p + "{g}c", Spec: conc, Name: "mine"}).Extend(ctx)
			return err
		}},
	} {
		t.Run(tc.marker, func(t *testing.T) {
			src, err := mutate.Apply(testedScript(t), "--", mutate.Edit{At: tc.marker, Old: "pcall(acl, '", New: "pcall(acl, 'NOSUCH"})
			if err != nil {
				t.Fatal(err)
			}
			broken := newLimiter(c, valkey.NewLuaScript(src))
			if err := tc.call(shipped); err != nil {
				t.Fatal(err)
			}
			before := dumpKeys(t, c, p, tc.keys)
			err = tc.call(broken)
			if !errors.Is(err, ErrNotExecuted) || errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(fmt.Sprint(err), "acl_check_cmd") {
				t.Errorf("a precheck the server raises on: err = %v; want ErrNotExecuted with the server's text", err)
			}
			if after := dumpKeys(t, c, p, tc.keys); after != before {
				t.Errorf("the keys changed although the call was not executed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// testedScript is the script under test: script.lua, or the mutant that
// TestMutants names in ADMIT_TEST_SCRIPT (it runs this package's test
// binary, built once, with each mutant of the script in turn).
func testedScript(t *testing.T) string {
	if path := os.Getenv("ADMIT_TEST_SCRIPT"); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	return scriptSource
}

// onceRecord is the once-record key of (key, id), without prefix.
func onceRecord(key, id string) string {
	r, err := onceKey(key, id)
	if err != nil {
		panic(err)
	}
	return r
}

// dumpKeys is each key's DUMP and PEXPIRETIME, a line a key.
func dumpKeys(t *testing.T, c valkey.Client, prefix string, keys []string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, k := range keys {
		v, err := c.Do(ctx, c.B().Dump().Key(prefix+k).Build()).ToString()
		if valkey.IsValkeyNil(err) {
			v, err = "(absent)", nil
		}
		if err != nil {
			t.Fatalf("DUMP %s: %v", k, err)
		}
		at, err := c.Do(ctx, c.B().Pexpiretime().Key(prefix+k).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PEXPIRETIME %s: %v", k, err)
		}
		b.WriteString(k + " " + strconv.Quote(v) + " " + strconv.FormatInt(at, 10) + "\n")
	}
	return b.String()
}
