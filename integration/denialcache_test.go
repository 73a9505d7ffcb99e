package integration

import (
	"context"
	"fmt"
	"github.com/admitkit/admit"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationDenialWritesNothing counts, on a real primary with a
// replica attached, the dataset changes (rdb_changes_since_last_save) and
// replication bytes (master_repl_offset) of denials, on every denial path:
// none, where a script that rewrote every denied bucket would cost 3
// dataset changes (HSET of two fields and PEXPIRE) a bucket.
func TestIntegrationDenialWritesNothing(t *testing.T) {
	primary, _ := testserver.OwnReplicated(t) // the replica counts in master_repl_offset
	pc := testserver.NewClient(t, primary)
	ctx := context.Background()
	infoString := func(c valkey.Client, section, field string) string {
		t.Helper()
		s, err := c.Do(ctx, c.B().Info().Section(section).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		return testserver.InfoFields(s)[field]
	}
	info := func(c valkey.Client, section, field string) int64 {
		t.Helper()
		v, err := strconv.ParseInt(infoString(c, section, field), 10, 64)
		if err != nil {
			t.Fatalf("INFO %s %s: %v", section, field, err)
		}
		return v
	}
	// No replication PINGs during the count.
	if err := pc.Do(ctx, pc.B().ConfigSet().ParameterValue().ParameterValue("repl-ping-replica-period", "3600").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	open := admit.MustSpec(admit.MaxLimit, 1<<30)
	shut := admit.MustSpec(admit.Every(time.Hour), 1)
	const calls = 100
	take := valkey.NewLuaScript(shipped)
	exec := func(keys []string, specs ...admit.Spec) (string, error) {
		return replyOf(take.Exec(ctx, pc, keys, takeArgs(specs...)), len(specs))
	}
	{
		for _, path := range []struct {
			name        string
			specs       []admit.Spec
			denied      string
			wantChanges int64 // per call
		}{
			{"one bucket denied", []admit.Spec{shut}, "1", 0},
			{"first denied", []admit.Spec{shut, open}, "1", 0},
			{"second denied", []admit.Spec{open, shut}, "2", 3}, // the first bucket is charged: HSET of two fields + PEXPIRE
		} {
			p := testserver.Prefix(t, pc)
			keys := []string{p + "a", p + "b"}[:len(path.specs)]
			for range 2 { // drain the shut bucket
				if _, err := exec(keys, path.specs...); err != nil {
					t.Fatal(err)
				}
			}
			changes, offset := info(pc, "persistence", "rdb_changes_since_last_save"), info(pc, "replication", "master_repl_offset")
			for range calls {
				reply, err := exec(keys, path.specs...)
				if err != nil || !strings.HasPrefix(reply, path.denied) {
					t.Fatalf("%s: reply %q, %v; want denied by %s", path.name, reply, err, path.denied)
				}
			}
			dChanges, dOffset := info(pc, "persistence", "rdb_changes_since_last_save")-changes, info(pc, "replication", "master_repl_offset")-offset
			if dChanges != path.wantChanges*calls {
				t.Errorf("%s: %d dataset changes in %d calls, want %d per call", path.name, dChanges, calls, path.wantChanges)
			}
			if path.wantChanges == 0 && dOffset != 0 {
				t.Errorf("%s: %d replication bytes in %d denials, want 0", path.name, dOffset, calls)
			}
		}
	}
}

// TestIntegrationDenialKeepsSlowerSpecAlive: a denial writes no fields,
// but when the Spec was made slower since the last write, it lengthens the
// key's expiry to the new time to full, so the key cannot expire early and
// come back as a full bucket; for a bucket alone and for the second bucket
// of a call (the script writes each bucket in lines of its own).
func TestIntegrationDenialKeepsSlowerSpecAlive(t *testing.T) {
	c, p := keyspace(t)
	l := admit.New(c)
	ctx := context.Background()
	open := admit.Request{Key: p + "open", Spec: admit.MustSpec(admit.Every(time.Second), 1000)}
	for _, bucket := range []uint8{1, 2} {
		allow := func(r admit.Request) (admit.Decision, error) {
			if bucket == 1 {
				return l.AllowOrdered(ctx, r, nil)
			}
			return l.AllowOrdered(ctx, open, &r)
		}
		r := admit.Request{Key: fmt.Sprintf("%sslower:%d", p, bucket), Spec: admit.MustSpec(admit.Every(time.Second), 2)}
		for range 2 {
			if d, err := allow(r); err != nil || !d.Allowed() {
				t.Fatalf("bucket %d: drain: %v, %v", bucket, d, err)
			}
		}
		r.Spec = admit.MustSpec(admit.Every(time.Hour), 2) // full again only in about 2 h now
		if d, err := allow(r); err != nil || d.Denied != bucket {
			t.Fatalf("bucket %d: after the change: %v, %v; want denied by it", bucket, d, err)
		}
		pttl, err := c.Do(ctx, c.B().Pttl().Key(r.Key).Build()).AsInt64()
		if want := (2 * time.Hour).Milliseconds(); err != nil || pttl < want-2000 || pttl > want+1 { // +1: rounded up to a ms
			t.Errorf("bucket %d: PTTL %d ms, %v; want about %d (the new Spec's time to full), not the old 2 s", bucket, pttl, err, want)
		}
	}
}

// TestIntegrationDenialCacheFlood: once the server has denied a key at
// its first bucket, a flood from 64 goroutines on that key with the cache
// on sends nothing (commandstats), and every answer is that denial.
func TestIntegrationDenialCacheFlood(t *testing.T) {
	srv := testserver.Own(t)
	c := testserver.NewClient(t, srv)
	l := admit.New(c, admit.WithDenialCache(16))
	ctx := context.Background()
	std, shared := admit.Request{Key: "rl:{flood}:std", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}, admit.Request{Key: "rl:{flood}:shared", Spec: admit.MustSpec(admit.Every(time.Second), 20)} // the shared key lives 20 s: long enough to read back
	if d, err := l.AllowOrdered(ctx, std, &shared); err != nil || !d.Allowed() {
		t.Fatalf("drain: %v, %v", d, err)
	}
	if d, err := l.AllowOrdered(ctx, std, &shared); err != nil || d.Denied != 1 {
		t.Fatalf("the server's denial: %v, %v", d, err)
	}
	before := testserver.CommandStats(t, c)
	const goroutines, calls = 64, 100
	var wg sync.WaitGroup
	var wrong atomic.Int64
	for range goroutines {
		wg.Go(func() {
			for range calls {
				if d, err := l.AllowOrdered(ctx, std, &shared); err != nil || d.Denied != 1 || d.RetryAfter <= 0 || d.RetryAfter > time.Hour {
					wrong.Add(1)
				}
			}
		})
	}
	wg.Wait()
	after := testserver.CommandStats(t, c)
	if n := after.ScriptCalls(before); n != 0 || wrong.Load() != 0 {
		t.Errorf("%d scripts ran and %d answers were not the cached denial, over %d calls; want 0 and 0", n, wrong.Load(), goroutines*calls)
	}
	if tk, _ := bucketFields(t, c, shared.Key); tk != 19 {
		t.Errorf("shared bucket holds %d tokens, want 19: a local denial must not touch it", tk)
	}
}

// bucketFields reads a bucket's tokens and ts.
func bucketFields(t *testing.T, c valkey.Client, key string) (tokens, ts int64) {
	t.Helper()
	v, err := c.Do(context.Background(), c.B().Hmget().Key(key).Field("tokens", "ts").Build()).AsStrSlice()
	if err != nil || len(v) != 2 {
		t.Fatalf("HMGET %s: %v %v", key, v, err)
	}
	tokens, _ = strconv.ParseInt(v[0], 10, 64)
	ts, _ = strconv.ParseInt(v[1], 10, 64)
	return tokens, ts
}
