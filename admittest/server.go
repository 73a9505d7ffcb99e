package admittest

import (
	"errors"
	"fmt"
	"sync"

	"github.com/admitkit/admit/internal/testserver"
)

// ErrNoServer is returned by [StartServer] and [StartCluster] when there is
// no server binary to start; a test usually skips on it.
var ErrNoServer = errors.New("admittest: no server binary: set VALKEY_SERVER=/path/to/valkey-server, " +
	"or put valkey-server (or redis-server) on PATH")

// StartServer starts a Valkey (or Redis) server of the test's own, for a
// suite run with [Owned] when no server is at hand: the binary named by
// VALKEY_SERVER, else valkey-server, else redis-server found on PATH. It
// listens on 127.0.0.1 at a free port, keeps nothing on disk, and gets
// args after its own arguments ("--maxmemory", "1mb", say). StartServer
// returns once the server answers, with its address and a function that
// stops it and removes its files (a second call does nothing); on Linux
// the server also ends with the process that started it. Without a binary
// it returns [ErrNoServer].
func StartServer(args ...string) (addr string, stop func(), err error) {
	bin := testserver.Binary()
	if bin == "" {
		return "", nil, ErrNoServer
	}
	srv, err := testserver.Start(bin, args...)
	if err != nil {
		return "", nil, fmt.Errorf("admittest: %w", err)
	}
	return srv.Addr, sync.OnceFunc(srv.Stop), nil
}

// StartCluster starts a Valkey Cluster of the test's own, for the suite's
// cluster rules: primaries servers started as [StartServer] starts one,
// each serving an equal share of the 16384 slots, without replicas.
// StartCluster returns once every node reports the cluster ready, at most
// 30 s after the servers answer, with the primaries' addresses and a
// function that stops them all. primaries must be at least 1; the suite's
// cross-slot rules need 2 or more. Without a binary it returns
// [ErrNoServer].
func StartCluster(primaries int) (addrs []string, stop func(), err error) {
	if primaries < 1 {
		return nil, nil, fmt.Errorf("admittest: StartCluster(%d): a cluster needs at least 1 primary", primaries)
	}
	bin := testserver.Binary()
	if bin == "" {
		return nil, nil, ErrNoServer
	}
	c, err := testserver.StartCluster(bin, primaries)
	if err != nil {
		return nil, nil, fmt.Errorf("admittest: %w", err)
	}
	return c.Addrs(), sync.OnceFunc(c.Stop), nil
}
