package edge_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/edge"
	"github.com/admitkit/admit/internal/minitest"
)

// TestDecide, on miniredis with its clock standing still: buckets alone
// are one AllowAll, with no Lease; with a concurrency part, one Acquire
// whose refusal by the slot carries the slot's RetryAfter (the oldest
// lease's time left) and the buckets' Remaining: not evaluated (-1), and
// untouched (the next grant leaves 0 of 3). Releasing a
// granted lease frees its slot; releasing one found expired says that
// the handler outlived it.
func TestDecide(t *testing.T) {
	srv, c := minitest.Start(t)
	lim := admit.New(c)
	ctx := context.Background()
	bucket := edge.Bucket{Policy: "b", Key: "{o}:b", Spec: admit.MustSpec(admit.Every(time.Hour), 3)}

	res, err := edge.Decide(ctx, lim, nil, edge.Rule{First: bucket}, time.Second)
	if err != nil || !res.Allowed() || res.Lease != nil || res.Decision.Remaining[0] != 2 {
		t.Fatalf("buckets alone: %+v, %v; want admitted, no lease, 2 left", res, err)
	}

	rule := edge.Rule{First: bucket, Concurrent: &edge.Concurrent{Policy: "c", Key: "{o}:c", Spec: admit.MustConcurrency(1, time.Minute)}}
	held, err := edge.Decide(ctx, lim, lim, rule, 0)
	if err != nil || !held.Allowed() || held.Lease == nil || held.Denied() != 0 || held.Decision.Remaining[0] != 1 {
		t.Fatalf("first slot: %+v, %v; want granted, 1 left", held, err)
	}
	refused, err := edge.Decide(ctx, lim, lim, rule, 0)
	if err != nil || refused.Allowed() || refused.Denied() != admit.PartSlot ||
		refused.Decision.RetryAfter != time.Minute || refused.Decision.Remaining != [2]int{-1, -1} {
		t.Fatalf("second slot: %+v (RetryAfter %v, Remaining %v), %v; want refused by the slot, retry after 1m, the bucket not evaluated", refused, refused.Decision.RetryAfter, refused.Decision.Remaining, err)
	}

	if err := edge.Release(ctx, held.Lease, 0); err != nil {
		t.Fatalf("release: %v", err)
	}
	again, err := edge.Decide(ctx, lim, lim, rule, 0)
	if err != nil || !again.Allowed() || again.Decision.Remaining[0] != 0 {
		t.Fatalf("after the release: %+v, %v; want granted, the bucket's last token taken", again, err)
	}
	srv.SetTime(minitest.Epoch.Add(2 * time.Minute))
	if err := edge.Release(ctx, again.Lease, 0); err == nil || !strings.Contains(err.Error(), "had expired") {
		t.Fatalf("release of an expired lease: %v; want the handler said to have outlived it", err)
	}
}
