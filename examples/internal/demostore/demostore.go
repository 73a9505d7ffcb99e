// Package demostore is the store the examples run on: the Valkey at
// VALKEY_ADDR (host:port) when it is set, else an in-process miniredis, so
// that an example needs nothing installed.
package demostore

import (
	"fmt"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// Connect dials VALKEY_ADDR, or starts an in-process miniredis. A non-zero
// fixedClock stops the in-process server's clock there (tests do this, so
// that a story does not depend on the machine's speed); zero leaves it on
// the machine's clock. It returns the client, where it is connected (for
// the example's first line), and the function that closes the client and
// stops the in-process server.
func Connect(fixedClock time.Time) (c valkey.Client, where string, stop func(), err error) {
	opt := valkey.ClientOption{DisableCache: true}
	stopServer := func() {}
	if addr := os.Getenv("VALKEY_ADDR"); addr != "" {
		opt.InitAddress = []string{addr}
		where = "Valkey at " + addr
	} else {
		srv, err := miniredis.Run()
		if err != nil {
			return nil, "", nil, err
		}
		if !fixedClock.IsZero() {
			srv.SetTime(fixedClock)
		}
		// miniredis answers CLUSTER SLOTS; without ForceSingleClient
		// valkey-go would treat it as a cluster.
		opt.InitAddress, opt.ForceSingleClient = []string{srv.Addr()}, true
		where = "an in-process miniredis (set VALKEY_ADDR=host:port to use your Valkey)"
		stopServer = srv.Close
	}
	c, err = valkey.NewClient(opt)
	if err != nil {
		stopServer()
		return nil, "", nil, fmt.Errorf("connect: %w", err)
	}
	return c, where, func() { c.Close(); stopServer() }, nil
}
