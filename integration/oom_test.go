package integration

import (
	"context"
	"errors"
	"github.com/admitkit/admit"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationOOMWritesNothing backs the decision to ship the script
// without a "#!lua" shebang: on a server over maxmemory the script's first
// write is refused, and since it writes only after every read, no key
// changes and the error is ErrNotExecuted.
func TestIntegrationOOMWritesNothing(t *testing.T) {
	srv := testserver.Own(t)
	c := testserver.NewClient(t, srv)
	ctx := context.Background()
	l := admit.New(c)
	spec := admit.MustSpec(admit.Every(time.Hour), 5)
	first, second := admit.Request{Key: "oom:{x}:1", Spec: spec}, admit.Request{Key: "oom:{x}:2", Spec: spec}
	if _, err := l.AllowOrdered(ctx, first, &second); err != nil {
		t.Fatal(err)
	}
	fresh := admit.Request{Key: "oom:{x}:fresh", Spec: spec}
	read := func() []string {
		var out []string
		for _, k := range []string{first.Key, second.Key, fresh.Key} {
			v, err := c.Do(ctx, c.B().Dump().Key(k).Build()).ToString()
			if err != nil && !valkey.IsValkeyNil(err) {
				t.Fatalf("DUMP %s: %v", k, err)
			}
			out = append(out, v)
		}
		return out
	}
	before := read()
	restore := overMaxmemory(t, c)

	for _, tc := range []struct {
		name   string
		first  admit.Request
		second *admit.Request
	}{{"existing buckets", first, &second}, {"fresh bucket", fresh, nil}} {
		_, err := l.AllowOrdered(ctx, tc.first, tc.second)
		if !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) {
			t.Errorf("%s: err = %v; want ErrNotExecuted (OOM refused before any write)", tc.name, err)
		}
		if err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Errorf("%s: err = %v; want the server's OOM refusal", tc.name, err)
		}
	}
	restore()
	after := read()
	for i := range before {
		if before[i] != after[i] {
			t.Errorf("key %d changed under OOM: %q -> %q", i, before[i], after[i])
		}
	}
}

// TestIntegrationOOMStillDenies is the other half of the no-shebang
// decision (docs/newer-servers.md): on a server over maxmemory a denial, a
// first-bucket denial of AllowOrderedOnce and a Peek are still decided,
// because the script only reads and, at most, lengthens an expiry
// (PEXPIREAT is not refused under OOM). With a "#!lua" line the server
// would refuse each of these calls before running it, and a caller that
// fails open on ErrNotExecuted would admit exactly the traffic a denial
// refuses. A second-bucket denial charges the first bucket, so like an
// admission it is refused, with nothing written.
func TestIntegrationOOMStillDenies(t *testing.T) {
	srv := testserver.Own(t)
	c := testserver.NewClient(t, srv)
	ctx := context.Background()
	l := admit.New(c)
	drained := admit.Request{Key: "oomdeny:{x}:drained", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
	open := admit.Request{Key: "oomdeny:{x}:open", Spec: admit.MustSpec(admit.Every(time.Hour), 5)}
	for _, r := range []admit.Request{drained, open} {
		if d, err := l.AllowOrdered(ctx, r, nil); err != nil || !d.Allowed() {
			t.Fatalf("AllowOrdered %s: %+v, %v; want allowed", r.Key, d, err)
		}
	}
	peek, err := l.Peek(ctx, open, nil)
	if err != nil || !peek.Allowed() {
		t.Fatalf("Peek before OOM: %+v, %v; want allowed", peek, err)
	}
	record, err := admit.OnceRecordKey(drained.Key, "id-1")
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{drained.Key, open.Key, record}
	read := func() []string {
		var out []string
		for _, k := range keys {
			out = append(out, ecRawKey(t, c, k))
		}
		return out
	}
	before := read()
	restore := overMaxmemory(t, c)

	denied := func(name string, d admit.Decision, err error) {
		t.Helper()
		if err != nil || d.Denied != 1 || d.RetryAfter <= 0 || d.RetryAfter > time.Hour || d.Remaining != [2]int{0, -1} {
			t.Errorf("%s under OOM: %+v, %v; want denied by bucket 1, RetryAfter in (0, 1h], Remaining [0 -1]", name, d, err)
		}
	}
	d, err := l.AllowOrdered(ctx, drained, nil)
	denied("one-bucket denial", d, err)
	d, err = l.AllowOrdered(ctx, drained, &open)
	denied("first-bucket denial", d, err)
	d, err = l.AllowOrderedOnce(ctx, "id-1", drained, nil)
	denied("AllowOrderedOnce first-bucket denial", d, err)
	if d, err := l.Peek(ctx, open, nil); err != nil || d != peek {
		t.Errorf("Peek under OOM: %+v, %v; want %+v, as before", d, err, peek)
	}
	_, err = l.AllowOrdered(ctx, open, &drained)
	if !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "OOM") {
		t.Errorf("second-bucket denial under OOM: err = %v; want ErrNotExecuted with the server's OOM refusal", err)
	}
	restore()
	after := read()
	for i := range before {
		if before[i] != after[i] {
			t.Errorf("%s changed under OOM: %s -> %s", keys[i], before[i], after[i])
		}
	}
}

// overMaxmemory puts the server over maxmemory (1 byte, noeviction), so that
// every write is refused with OOM, and returns a function, also run at the
// end of the test, that puts back the server's own maxmemory and policy.
func overMaxmemory(t *testing.T, c valkey.Client) (restore func()) {
	t.Helper()
	ctx := context.Background()
	was, err := c.Do(ctx, c.B().ConfigGet().Parameter("maxmemory", "maxmemory-policy").Build()).AsStrMap()
	if err != nil || was["maxmemory"] == "" || was["maxmemory-policy"] == "" {
		t.Fatalf("CONFIG GET maxmemory maxmemory-policy: %v %v", was, err)
	}
	restore = func() {
		c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", was["maxmemory"]).
			ParameterValue("maxmemory-policy", was["maxmemory-policy"]).Build())
	}
	if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", "noeviction").ParameterValue("maxmemory", "1").Build()).Error(); err != nil {
		t.Fatalf("CONFIG SET maxmemory: %v", err)
	}
	t.Cleanup(restore)
	return restore
}
