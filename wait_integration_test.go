package admit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
)

// TestIntegrationWaitTokenBeforeDeadline: a bucket of 1 token per 200 ms,
// emptied, and a Wait whose deadline is 8 ms after the moment the denial
// said the next token comes. The token comes before the deadline, so each
// of the 20 Waits must be admitted. (Before the fix, Wait's jitter of up to
// 10% of RetryAfter, about 20 ms here, was not capped at the deadline, and
// most Waits slept past it: 11-17 of 20 failed.)
func TestIntegrationWaitTokenBeforeDeadline(t *testing.T) {
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	l := New(c)
	ctx := context.Background()
	r := Request{Key: testserver.Prefix(t, c) + "tick", Spec: MustSpec(Every(200*time.Millisecond), 1)}
	const tries, margin = 20, 8 * time.Millisecond
	admitted := 0
	var failures []string
	for i := range tries {
		// Empty the bucket, and learn from a denial when its next token
		// comes: at the latest RetryAfter after the reply.
		var d Decision
		var replied time.Time
		for range 3 {
			var err error
			if d, err = l.AllowOrdered(ctx, r, nil); err != nil {
				t.Fatal(err)
			}
			replied = time.Now()
			if !d.Allowed() {
				break
			}
		}
		if d.Allowed() {
			t.Fatalf("try %d: the bucket admitted 3 calls in a row; want a denial", i)
		}
		wctx, cancel := context.WithDeadline(ctx, replied.Add(d.RetryAfter+margin))
		got, err := l.Wait(wctx, r, nil)
		cancel()
		if err == nil && got.Allowed() {
			admitted++
		} else {
			failures = append(failures, fmt.Sprintf("try %d (token in %v): %v, %v", i, d.RetryAfter, got, err))
		}
	}
	t.Logf("%d of %d Waits admitted with the token %v before the deadline", admitted, tries, margin)
	if admitted != tries {
		t.Errorf("%d of %d Waits admitted, want all: the token came %v before each deadline; failures:\n%s", admitted, tries, margin, strings.Join(failures, "\n"))
	}
}
