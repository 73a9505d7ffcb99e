package admit

import (
	"context"
	"errors"
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
	l := New(c)
	spec := MustSpec(Every(time.Hour), 5)
	first, second := Request{Key: "oom:{x}:1", Spec: spec}, Request{Key: "oom:{x}:2", Spec: spec}
	if _, err := l.AllowOrdered(ctx, first, &second); err != nil {
		t.Fatal(err)
	}
	fresh := Request{Key: "oom:{x}:fresh", Spec: spec}
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
	// Put back what the server had, whoever's server it is.
	was, err := c.Do(ctx, c.B().ConfigGet().Parameter("maxmemory", "maxmemory-policy").Build()).AsStrMap()
	if err != nil || was["maxmemory"] == "" || was["maxmemory-policy"] == "" {
		t.Fatalf("CONFIG GET maxmemory maxmemory-policy: %v %v", was, err)
	}
	restore := func() {
		c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", was["maxmemory"]).
			ParameterValue("maxmemory-policy", was["maxmemory-policy"]).Build())
	}
	if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", "noeviction").ParameterValue("maxmemory", "1").Build()).Error(); err != nil {
		t.Fatalf("CONFIG SET maxmemory: %v", err)
	}
	t.Cleanup(restore)

	for _, tc := range []struct {
		name   string
		first  Request
		second *Request
	}{{"existing buckets", first, &second}, {"fresh bucket", fresh, nil}} {
		_, err := l.AllowOrdered(ctx, tc.first, tc.second)
		if !errors.Is(err, ErrNotExecuted) || errors.Is(err, ErrOutcomeUnknown) {
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
