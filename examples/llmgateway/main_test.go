package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopShared()
	os.Exit(code)
}

// The story the workload tells, request by request: HTTP status, and what
// was refunded.
var wantOutcomes = []string{
	"p1: 200",
	"s1: 200, used 2000 (prompt 500 + answer 1500), 500 unused refunded to the standard and shared buckets",
	"s2: 200",
	"s3: 429, refused by the standard bucket",
	"p2: 200, used 1200 (prompt 300 + answer 900), 100 unused refunded to the shared bucket",
	"s4: 429, refused by the shared bucket; the 1000 tokens reserved in the lane's bucket refunded",
	"s5: 200",
	"p3: 429, refused by the shared bucket",
}

var wantSummary = summary{admitted: 5, refusedByLane: 1, refusedByShared: 2, refunded: 500*2 + 100 + 1000, waitGaveUp: true}

// TestRunOnServer runs the gateway against a real server and checks every
// decision, the refunds, and what the buckets hold at the end: exactly the
// tokens the story leaves (lane 900, shared 200), plus at most what they
// refilled while the run took, by the server's clock.
func TestRunOnServer(t *testing.T) {
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	ctx := context.Background()
	prefix := testserver.Prefix(t, c)
	t0 := serverMicros(t, c)
	var out strings.Builder
	sum, err := run(ctx, &out, c, prefix)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	elapsed := serverMicros(t, c) - t0
	checkStory(t, out.String(), sum)

	g := newGateway(c, prefix)
	for _, b := range []struct {
		key          string
		want         int64
		intervalUsec int64
	}{
		{g.laneKey, 900, laneSpec.Interval().Microseconds()},
		{g.sharedKey, 200, sharedSpec.Interval().Microseconds()},
	} {
		s, err := c.Do(ctx, c.B().Hget().Key(b.key).Field("tokens").Build()).ToString()
		if err != nil {
			t.Fatalf("HGET %s tokens: %v", b.key, err)
		}
		got, _ := strconv.ParseInt(s, 10, 64)
		if refilled := elapsed/b.intervalUsec + 1; got < b.want || got > b.want+refilled {
			t.Errorf("%s holds %d tokens, want %d plus at most the %d refilled in the run's %dµs", b.key, got, b.want, refilled, elapsed)
		}
	}
}

// TestRunInProcess is what go run does with no VALKEY_ADDR: the same story
// on an in-process miniredis.
func TestRunInProcess(t *testing.T) {
	t.Setenv("VALKEY_ADDR", "")
	c, _, stop, err := connect()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	var out strings.Builder
	sum, err := run(context.Background(), &out, c, "llmgateway:")
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	checkStory(t, out.String(), sum)
}

func checkStory(t *testing.T, out string, sum summary) {
	t.Helper()
	if sum != wantSummary {
		t.Errorf("summary %+v, want %+v", sum, wantSummary)
	}
	var got []string
	for _, line := range strings.Split(out, "\n") {
		id, rest, ok := strings.Cut(line, " ")
		if _, outcome, found := strings.Cut(rest, " tokens: "); ok && found && len(id) == 2 {
			got = append(got, id+": "+outcome)
		}
	}
	if len(got) != len(wantOutcomes) {
		t.Fatalf("%d request lines, want %d:\n%s", len(got), len(wantOutcomes), out)
	}
	for i, want := range wantOutcomes {
		if !strings.HasPrefix(got[i], want) {
			t.Errorf("request %d: %q, want it to start with %q", i, got[i], want)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}

func serverMicros(t *testing.T, c valkey.Client) int64 {
	t.Helper()
	v, err := c.Do(context.Background(), c.B().Time().Build()).AsIntSlice()
	if err != nil || len(v) != 2 {
		t.Fatalf("TIME: %v %v", v, err)
	}
	return v[0]*1_000_000 + v[1]
}
