package edge_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/edge"
	"github.com/admitkit/admit/internal/minitest"
	"github.com/admitkit/admit/internal/model"
)

// TestQuotaAgainstModel: random decisions of costs from 1 to the burst,
// with refunds of random sizes between them, on miniredis with a clock the
// test moves by random steps. After each decision the bucket's state is
// read from the store and refilled by the model: the Quota's Remaining is
// the model's tokens; a refused bucket's Reset is exactly the model's wait
// for its next token, whatever the cost (the RetryAfter is the wait for
// the whole cost, never earlier than the Reset); an admitted bucket's is
// its Interval, never shorter than that wait.
func TestQuotaAgainstModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := testingSeed(); s != 0 {
		seed = s
	}
	t.Logf("EDGE_SEED=%d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	srv, c := minitest.Start(t)
	lim := admit.New(c)
	ctx := context.Background()
	now := minitest.Epoch
	refused, refunds := 0, 0
	for round := range 40 {
		iv := time.Duration(1+rng.IntN(2000)) * time.Millisecond
		burst := 1 + rng.IntN(20)
		spec := admit.MustSpec(admit.Every(iv), burst)
		key := "q:" + strconv.Itoa(round)
		for step := range 50 {
			now = now.Add(time.Duration(rng.Int64N(int64(2*iv)/1000)) * time.Microsecond)
			srv.SetTime(now)
			b := edge.Bucket{Policy: "p", Key: key, Spec: spec, Cost: 1 + rng.IntN(burst)}
			if rng.IntN(4) == 0 {
				if err := lim.Refund(ctx, admit.Request{Key: key, Spec: spec, Cost: b.Cost}, nil); err != nil {
					t.Fatal(err)
				}
				refunds++
				continue
			}
			res, err := edge.Decide(ctx, lim, edge.Rule{First: b}, 0)
			if err != nil {
				t.Fatal(err)
			}
			tokens, terr := c.Do(ctx, c.B().Hget().Key(key).Field("tokens").Build()).AsInt64()
			ts, serr := c.Do(ctx, c.B().Hget().Key(key).Field("ts").Build()).AsInt64()
			if terr != nil || serr != nil {
				t.Fatalf("round %d step %d: state %v %v", round, step, terr, serr)
			}
			nowUs := now.UnixMicro()
			tk, ts := model.Refill(nowUs, spec, model.State{Tokens: tokens, TS: ts}, true)
			q := edge.Quotas(edge.Rule{First: b}, res)[0]
			next := time.Duration(ts+iv.Microseconds()-nowUs) * time.Microsecond
			switch {
			case q.Remaining != int(tk):
				t.Fatalf("round %d step %d: Remaining %d, model %d", round, step, q.Remaining, tk)
			case int(tk) >= burst:
				if q.HasReset {
					t.Fatalf("round %d step %d: full bucket with Reset %v", round, step, q.Reset)
				}
			case q.Refused:
				refused++
				if q.Reset != next || res.Decision.RetryAfter < q.Reset {
					t.Fatalf("round %d step %d (cost %d, %d held, interval %v): Reset %v, RetryAfter %v; want the next token's %v, and RetryAfter no earlier",
						round, step, b.Cost, tk, iv, q.Reset, res.Decision.RetryAfter, next)
				}
			default:
				if q.Reset != iv || next > iv {
					t.Fatalf("round %d step %d: admitted, Reset %v, next token %v; want the interval %v, no shorter", round, step, q.Reset, next, iv)
				}
			}
		}
	}
	t.Logf("%d refusals and %d refunds checked", refused, refunds)
	if refused == 0 || refunds == 0 {
		t.Fatalf("%d refusals, %d refunds: the walk checked nothing", refused, refunds)
	}
}

// testingSeed reads EDGE_SEED, 0 when unset.
func testingSeed() uint64 {
	s, _ := strconv.ParseUint(os.Getenv("EDGE_SEED"), 10, 64)
	return s
}
