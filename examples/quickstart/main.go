// Command quickstart shows ordered admission keeping a share of a budget for
// premium traffic. It runs against VALKEY_ADDR (host:port) when set, else
// against an in-process miniredis, so it needs nothing installed:
//
//	go run ./examples/quickstart
//	VALKEY_ADDR=127.0.0.1:6379 go run ./examples/quickstart
//
// A channel may receive 10 messages at once (the shared bucket). Standard
// senders may use at most 6 of them (their own bucket, checked first);
// premium senders use the shared bucket alone, so at least 4 stay theirs.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/internal/demostore"
)

// Specs are built once. Both keys share the hash tag {chan:42}, so on Valkey
// Cluster they live in one slot and one script can decide both.
var (
	shared   = admit.MustSpec(admit.Every(time.Second), 10)  // 10 at once, then 1/s
	standard = admit.MustSpec(admit.Every(2*time.Second), 6) // 6 at once, then 1 per 2 s
)

const (
	standardKey = "quickstart:{chan:42}:standard"
	sharedKey   = "quickstart:{chan:42}:shared"
)

func main() {
	if err := run(context.Background(), os.Stdout, time.Time{}); err != nil { // the machine's clock
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// run tells the story on VALKEY_ADDR's server, or on an in-process one
// whose clock is fixedClock when that is not zero (see demostore.Connect).
func run(ctx context.Context, w io.Writer, fixedClock time.Time) error {
	client, where, stop, err := demostore.Connect(fixedClock)
	if err != nil {
		return err
	}
	defer stop()
	// Start from fresh buckets, deleting only this demo's two keys.
	if err := client.Do(ctx, client.B().Del().Key(standardKey, sharedKey).Build()).Error(); err != nil {
		return err
	}
	lim := admit.New(client)
	fmt.Fprintf(w, "admit quickstart on %s\n", where)
	fmt.Fprintf(w, "  shared bucket   %s\n  standard bucket %s\n\n", shared, standard)

	std := admit.Request{Key: standardKey, Spec: standard}
	prem := admit.Request{Key: sharedKey, Spec: shared}

	fmt.Fprintln(w, "8 standard messages: their own bucket first, then the shared one")
	for i := 1; i <= 8; i++ {
		d, err := lim.AllowOrdered(ctx, std, &prem)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  standard #%d  %s\n", i, describe(d, "standard", "shared"))
	}
	fmt.Fprintln(w, "\n6 premium messages: the shared bucket alone")
	for i := 1; i <= 6; i++ {
		d, err := lim.AllowOrdered(ctx, prem, nil)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  premium  #%d  %s\n", i, describe(d, "shared", ""))
	}
	fmt.Fprintln(w, "\nStandard traffic stopped at its own 6; its refusals took nothing from the")
	fmt.Fprintln(w, "shared bucket, so premium still got the 4 messages reserved for it.")
	return nil
}

func describe(d admit.Decision, first, second string) string {
	switch d.Denied {
	case 0:
		return "admitted"
	case 1:
		return fmt.Sprintf("denied by the %s bucket, retry after %v", first, d.RetryAfter.Round(time.Millisecond))
	default:
		return fmt.Sprintf("denied by the %s bucket, retry after %v", second, d.RetryAfter.Round(time.Millisecond))
	}
}
