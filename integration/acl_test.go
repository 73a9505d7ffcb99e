package integration

import (
	"context"
	"errors"
	"fmt"
	"github.com/admitkit/admit"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// leastPrivilege is docs/acl.md's least-privilege ACL for admit, without the
// key pattern.
const leastPrivilege = "-@all +evalsha +eval +evalsha_ro +eval_ro +time +hmget +hset +pexpireat +exists +get +set " +
	"+zscore +zcard +zcount +zrange +zrangebyscore +zadd +zremrangebyscore +zrem"

// TestIntegrationACL runs decisions as ACL users that lack one permission
// each: every call fails, names what is missing, is classed not executed,
// and leaves both buckets byte for byte as they were (no partial charge, no
// key without an expiry). The least-privilege user decides normally.
// (Before the fix, a user without HMGET got ErrWrongType on a key that did
// not exist, and a user without PEXPIRE charged the second bucket, left the
// first one alone, and left the second key with no expiry.)
func TestIntegrationACL(t *testing.T) {
	srv := testserver.Own(t)
	admin := testserver.NewClient(t, srv)
	ctx := context.Background()
	p := "rl:{acl}:"
	std, shared := admit.Request{Key: p + "std", Spec: admit.MustSpec(admit.Every(time.Hour), 5)}, admit.Request{Key: p + "shared", Spec: admit.MustSpec(admit.Every(time.Hour), 5)}

	client := func(name, rules string, selectors ...string) valkey.Client {
		t.Helper()
		args := append(append([]string{name, "reset", "on", ">pw"}, strings.Fields(rules)...), selectors...)
		if err := admin.Do(ctx, admin.B().AclSetuser().Username(args[0]).Rule(args[1:]...).Build()).Error(); err != nil {
			t.Fatalf("ACL SETUSER %s %s: %v", name, rules, err)
		}
		// Registered before the client's Close, so it runs after it: on a
		// shared server (VALKEY_ADDR with VALKEY_ALLOW_DESTRUCTIVE=1) no user stays.
		t.Cleanup(func() { admin.Do(context.Background(), admin.B().AclDeluser().Username(name).Build()) })
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, Username: name, Password: "pw", DisableCache: true})
		if err != nil {
			t.Fatalf("connect as %s: %v", name, err)
		}
		t.Cleanup(c.Close)
		return c
	}
	user := func(name, rules string, selectors ...string) *admit.Limiter {
		t.Helper()
		return admit.New(client(name, rules, selectors...))
	}

	good := user("admit", leastPrivilege+" ~"+p+"*")
	drained := admit.Request{Key: p + "drained", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
	if d, err := good.AllowOrdered(ctx, drained, nil); err != nil || !d.Allowed() {
		t.Fatalf("drain: %v, %v", d, err)
	}
	// Fresh buckets, then one call each so that both hold state to protect.
	if d, err := good.AllowOrdered(ctx, std, &shared); err != nil || !d.Allowed() {
		t.Fatalf("least-privilege user: %v, %v; want allowed", d, err)
	}

	// A denial writes one command only (PEXPIREAT GT), unchecked beforehand:
	// its refusal must still name the permission and change nothing.
	t.Run("no pexpireat, denial", func(t *testing.T) {
		l := user("no-pexpireat-denial", strings.Replace(leastPrivilege, "+pexpireat", "", 1)+" ~"+p+"*")
		before := keysState(t, admin, drained.Key)
		d, err := l.AllowOrdered(ctx, drained, nil)
		if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "PEXPIREAT") || d.Allowed() {
			t.Errorf("got %v, %v; want NOPERM naming PEXPIREAT, not executed", d, err)
		}
		if after := keysState(t, admin, drained.Key); after != before {
			t.Errorf("the bucket changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	// A one-bucket admission's HSET is its first write, unchecked beforehand
	// and run under pcall: its refusal must name HSET and change nothing.
	t.Run("no hset, one bucket", func(t *testing.T) {
		l := user("no-hset-one", strings.Replace(leastPrivilege, "+hset", "", 1)+" ~"+p+"*")
		before := keysState(t, admin, std.Key)
		d, err := l.AllowOrdered(ctx, std, nil)
		if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "HSET") || d.Allowed() {
			t.Errorf("got %v, %v; want NOPERM naming HSET, not executed", d, err)
		}
		if after := keysState(t, admin, std.Key); after != before {
			t.Errorf("the bucket changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	// HSET granted on one bucket only, by an ACL selector. An admission
	// writes bucket 1 first: HSET std runs under pcall, so where only
	// shared may be written the first write fails whole; where only std
	// may be written the first write would succeed and the third (HSET
	// shared) fail, so the precheck must cover every write after the first.
	t.Run("hset on the standard bucket only", func(t *testing.T) {
		l := user("hset-std-only", strings.Replace(leastPrivilege, "+hset", "", 1)+" ~"+p+"*", "(+hset ~"+std.Key+")")
		before := keysState(t, admin, std.Key, shared.Key)
		d, err := l.AllowOrdered(ctx, std, &shared)
		if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "HSET on bucket 2") || d.Allowed() {
			t.Errorf("got %v, %v; want NOPERM naming HSET on bucket 2, not executed", d, err)
		}
		if after := keysState(t, admin, std.Key, shared.Key); after != before {
			t.Errorf("the buckets changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	t.Run("hset on the shared bucket only", func(t *testing.T) {
		l := user("hset-shared-only", strings.Replace(leastPrivilege, "+hset", "", 1)+" ~"+p+"*", "(+hset ~"+shared.Key+")")
		before := keysState(t, admin, std.Key, shared.Key)
		d, err := l.AllowOrdered(ctx, std, &shared)
		if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "HSET on bucket 1") || d.Allowed() {
			t.Errorf("got %v, %v; want NOPERM naming HSET on bucket 1, not executed", d, err)
		}
		if after := keysState(t, admin, std.Key, shared.Key); after != before {
			t.Errorf("the buckets changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	// The script writes each bucket in lines of its own, so each bucket's
	// PEXPIREAT check is proven on its own: a one-bucket admission (bucket
	// 1's check alone stands between HSET and a key with no expiry), then
	// PEXPIREAT granted on bucket 1's key only, for an admission (bucket 2
	// STORE) and for a second-bucket denial (bucket 2 KEEP).
	t.Run("no pexpireat, one bucket", func(t *testing.T) {
		l := user("no-pexpireat-one", strings.Replace(leastPrivilege, "+pexpireat", "", 1)+" ~"+p+"*")
		before := keysState(t, admin, std.Key)
		d, err := l.AllowOrdered(ctx, std, nil)
		if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "PEXPIREAT on bucket 1") || d.Allowed() {
			t.Errorf("got %v, %v; want NOPERM naming PEXPIREAT on bucket 1, not executed", d, err)
		}
		if after := keysState(t, admin, std.Key); after != before {
			t.Errorf("the bucket changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	stdOnly := user("pexpireat-std-only", strings.Replace(leastPrivilege, "+pexpireat", "", 1)+" ~"+p+"*", "(+pexpireat ~"+std.Key+")")
	drained2 := admit.Request{Key: p + "drained2", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
	if d, err := good.AllowOrdered(ctx, drained2, nil); err != nil || !d.Allowed() {
		t.Fatalf("drain: %v, %v", d, err)
	}
	for _, second := range []admit.Request{shared, drained2} {
		t.Run("pexpireat on the standard bucket only, second bucket "+strings.TrimPrefix(second.Key, p), func(t *testing.T) {
			before := keysState(t, admin, std.Key, second.Key)
			d, err := stdOnly.AllowOrdered(ctx, std, &second)
			if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "PEXPIREAT on bucket 2") || d.Allowed() {
				t.Errorf("got %v, %v; want NOPERM naming PEXPIREAT on bucket 2, not executed", d, err)
			}
			if after := keysState(t, admin, std.Key, second.Key); after != before {
				t.Errorf("the buckets changed:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
	// Bucket 2's HSET is the first write only in a refund whose bucket 1
	// has no key (it is full already: nothing to write): the refusal of
	// that first write, run under pcall, must name HSET on bucket 2.
	t.Run("hset on the standard bucket only, refund of an absent first bucket", func(t *testing.T) {
		c := client("hset-std-only-refund", strings.Replace(leastPrivilege, "+hset", "", 1)+" ~"+p+"*", "(+hset ~"+p+"absent)")
		keys := []string{p + "absent", shared.Key}
		before := keysState(t, admin, keys...)
		err := valkey.NewLuaScript(shipped).Exec(ctx, c, keys, append(takeArgs(std.Spec, shared.Spec), modeRefund)).Error()
		if err == nil || !strings.Contains(err.Error(), "NOPERM admit: the ACL user may not run HSET on bucket 2") {
			t.Errorf("got %v; want NOPERM naming HSET on bucket 2", err)
		}
		if after := keysState(t, admin, keys...); after != before {
			t.Errorf("the buckets changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	for _, tc := range []struct {
		name, rules, want string
	}{
		{"no hmget", strings.Replace(leastPrivilege, "+hmget", "", 1) + " ~" + p + "*", "HMGET"},
		{"no hset", strings.Replace(leastPrivilege, "+hset", "", 1) + " ~" + p + "*", "HSET"},
		{"no pexpireat", strings.Replace(leastPrivilege, "+pexpireat", "", 1) + " ~" + p + "*", "PEXPIREAT"},
		{"no time", strings.Replace(leastPrivilege, "+time", "", 1) + " ~" + p + "*", "TIME"},
		{"no exists", strings.Replace(leastPrivilege, "+exists", "", 1) + " ~" + p + "*", "EXISTS"},
		{"shared bucket read-only", leastPrivilege + " ~" + p + "std %R~" + p + "shared", "NOPERM"}, // refused by EVAL itself, before the script runs
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := user(strings.ReplaceAll(tc.name, " ", "-"), tc.rules)
			keys := []string{std.Key, shared.Key}
			if tc.want == "EXISTS" {
				keys = []string{p + "fresh-std", p + "fresh-shared"} // EXISTS runs for a key with no bucket fields
			}
			first, second := admit.Request{Key: keys[0], Spec: std.Spec}, admit.Request{Key: keys[1], Spec: shared.Spec}
			before := keysState(t, admin, keys...)
			d, err := l.AllowOrdered(ctx, first, &second)
			if err == nil || !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) || d.Allowed() {
				t.Fatalf("got %v, %v; want an error classed not executed", d, err)
			}
			if errors.Is(err, admit.ErrWrongType) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name the missing permission %q", err, tc.want)
			}
			if after := keysState(t, admin, keys...); after != before {
				t.Errorf("a refused call changed the buckets:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}
