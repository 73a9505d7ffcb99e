package admit

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
)

// TestIntegrationWaitTokenBeforeDeadline: 20 buckets of 1 token per 2 s,
// each emptied, and on each a Wait whose deadline is 80 ms after the moment
// the denial said the next token comes. The token comes before the
// deadline, so each of the 20 Waits must be admitted. (Before the fix,
// Wait's jitter of up to 10% of RetryAfter, 200 ms here, was not capped at
// the deadline, and most Waits slept past it: 10-12 of 20 failed, as 11-17
// of 20 did in the report with 1 token per 200 ms and 8 ms.) The
// issue's case is scaled in time by 10, so that the scheduling delays of a
// loaded test machine (several ms) do not count, and the Waits run side by
// side, so that the test takes about 2 s.
func TestIntegrationWaitTokenBeforeDeadline(t *testing.T) {
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	l := New(c)
	ctx := context.Background()
	p := testserver.Prefix(t, c)
	spec := MustSpec(Every(2*time.Second), 1)
	const tries, margin = 20, 80 * time.Millisecond
	failures := make([]string, tries) // "" for an admitted Wait
	var wg sync.WaitGroup
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := Request{Key: p + strconv.Itoa(i), Spec: spec}
			// Empty the bucket, and learn from a denial when its next
			// token comes: at the latest RetryAfter after the reply.
			var d Decision
			var replied time.Time
			for range 3 {
				var err error
				if d, err = l.AllowOrdered(ctx, r, nil); err != nil {
					failures[i] = fmt.Sprintf("try %d: emptying the bucket: %v", i, err)
					return
				}
				replied = time.Now()
				if !d.Allowed() {
					break
				}
			}
			if d.Allowed() {
				failures[i] = fmt.Sprintf("try %d: the bucket admitted 3 calls in a row; want a denial", i)
				return
			}
			wctx, cancel := context.WithDeadline(ctx, replied.Add(d.RetryAfter+margin))
			defer cancel()
			if got, err := l.Wait(wctx, r, nil); err != nil || !got.Allowed() {
				failures[i] = fmt.Sprintf("try %d (token in %v): %v, %v", i, d.RetryAfter, got, err)
			}
		}()
	}
	wg.Wait()
	var failed []string
	for _, f := range failures {
		if f != "" {
			failed = append(failed, f)
		}
	}
	t.Logf("%d of %d Waits admitted with the token %v before the deadline", tries-len(failed), tries, margin)
	if len(failed) != 0 {
		t.Errorf("%d of %d Waits admitted, want all: the token came %v before each deadline; failures:\n%s", tries-len(failed), tries, margin, strings.Join(failed, "\n"))
	}
}
