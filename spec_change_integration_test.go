package admit

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationSpecChange pins what a live Spec change does to a bucket
// that already holds state (outgress changes a channel's Spec when its
// moderator status changes): README, "Changing a Spec on a live bucket".
func TestIntegrationSpecChange(t *testing.T) {
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	l := New(c)
	ctx := context.Background()
	p := testserver.Prefix(t, c)
	hourly := func(burst int) Spec { return MustSpec(Every(time.Hour), burst) }
	call := func(r Request) Decision {
		t.Helper()
		d, err := l.AllowOrdered(ctx, r, nil)
		if err != nil {
			t.Fatalf("%s: %v", r.Key, err)
		}
		return d
	}
	admitted := func(r Request, max int) (n int) {
		t.Helper()
		for range max + 1 {
			if !call(r).Allowed() {
				return n
			}
			n++
		}
		return n
	}

	t.Run("burst raised: no instant tokens", func(t *testing.T) {
		r := Request{Key: p + "raised", Spec: hourly(3)}
		if n := admitted(r, 3); n != 3 {
			t.Fatalf("burst 3 admitted %d", n)
		}
		r.Spec = hourly(10)
		if n := admitted(r, 10); n != 0 {
			t.Errorf("after raising burst 3 to 10 on an empty bucket: %d admitted at once, want 0", n)
		}
	})
	t.Run("burst lowered: tokens capped", func(t *testing.T) {
		r := Request{Key: p + "lowered", Spec: hourly(10)}
		call(r) // 9 left
		r.Spec = hourly(3)
		if n := admitted(r, 10); n != 3 {
			t.Errorf("after lowering burst 10 to 3 with 9 tokens left: %d admitted, want 3", n)
		}
	})
	t.Run("rate changed: the part-token recounted at the new interval", func(t *testing.T) {
		r := Request{Key: p + "rate", Spec: hourly(2)} // burst 2: one token earned does not fill it
		now := serverMicros(t, c)
		half := int64(30 * time.Minute / time.Microsecond)
		setBucket(t, c, r.Key, 0, now-half) // empty, half an hour into the next token
		if d := call(r); d.Denied != 1 || d.RetryAfter > 30*time.Minute || d.RetryAfter < 29*time.Minute {
			t.Fatalf("at 1/h: %v, want denied for about 30m", d)
		}
		r.Spec = MustSpec(Every(20*time.Minute), 2)
		if d := call(r); !d.Allowed() {
			t.Fatalf("at 1/20m, 30 m after ts: %v, want allowed", d)
		}
		// 30 min at 20 min a token: one token, and the 10 min remainder is
		// kept: ts moved by exactly one new interval.
		if tk, ts := bucketFields(t, c, r.Key); tk != 0 || ts != now-half+int64(20*time.Minute/time.Microsecond) {
			t.Errorf("stored tokens %d ts %d, want 0 and %d (old ts + one new interval)", tk, ts, now-half+int64(20*time.Minute/time.Microsecond))
		}
	})
	t.Run("TTL follows the new Spec", func(t *testing.T) {
		r := Request{Key: p + "ttl", Spec: hourly(2)}
		call(r)
		r.Spec = MustSpec(Every(time.Minute), 2)
		call(r)
		pttl, err := c.Do(ctx, c.B().Pttl().Key(r.Key).Build()).AsInt64()
		if want := r.Spec.TTL().Milliseconds(); err != nil || pttl > want || pttl < want-1000 {
			t.Errorf("PTTL after the change %d ms, %v; want the new Spec's TTL, %d ms", pttl, err, want)
		}
	})
}

func serverMicros(t *testing.T, c valkey.Client) int64 {
	t.Helper()
	v, err := c.Do(context.Background(), c.B().Time().Build()).AsStrSlice()
	if err != nil || len(v) != 2 {
		t.Fatalf("TIME: %v %v", v, err)
	}
	s, _ := strconv.ParseInt(v[0], 10, 64)
	us, _ := strconv.ParseInt(v[1], 10, 64)
	return s*1_000_000 + us
}

func setBucket(t *testing.T, c valkey.Client, key string, tokens, ts int64) {
	t.Helper()
	cmd := c.B().Hset().Key(key).FieldValue().FieldValue("tokens", strconv.FormatInt(tokens, 10)).FieldValue("ts", strconv.FormatInt(ts, 10)).Build()
	if err := c.Do(context.Background(), cmd).Error(); err != nil {
		t.Fatal(err)
	}
}

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
