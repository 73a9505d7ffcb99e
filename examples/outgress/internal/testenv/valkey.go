package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitkit/admit/admittest"
	"github.com/valkey-io/valkey-go"
)

// A Server is a valkey-server (or redis-server) the tests started
// (admittest.StartServer) on 127.0.0.1 at a free port, without
// persistence. Its keys are the tests' alone: nothing needs cleaning up,
// it goes away with Stop.
type Server struct {
	Addr string
	Stop func() // stops the server; a second call does nothing
}

var shared struct {
	once sync.Once
	srv  Server
	err  error
}

// Shared is the test binary's server, started by its first caller and
// stopped by Stop (Main calls it). Tests on it keep apart by key prefix
// (Prefix).
func Shared(tb testing.TB) *Server {
	tb.Helper()
	shared.once.Do(func() { shared.srv.Addr, shared.srv.Stop, shared.err = admittest.StartServer() })
	need(tb, shared.err)
	return &shared.srv
}

// Own starts a server of the test's own, stopped with the test: for
// tests that stop it, flush its scripts or change its configuration.
func Own(tb testing.TB) *Server {
	tb.Helper()
	var s Server
	var err error
	s.Addr, s.Stop, err = admittest.StartServer()
	need(tb, err)
	tb.Cleanup(s.Stop)
	return &s
}

var cluster struct {
	once  sync.Once
	addrs []string
	stop  func()
	err   error
}

// Cluster is the addresses of a 3-primary Valkey Cluster, started by its
// first caller and stopped by Stop.
func Cluster(tb testing.TB) []string {
	tb.Helper()
	cluster.once.Do(func() { cluster.addrs, cluster.stop, cluster.err = admittest.StartCluster(3) })
	need(tb, cluster.err)
	return cluster.addrs
}

// need goes on with a test that got its server (err == nil); it skips
// the test when there is no server binary, or fails it when
// ADMIT_REQUIRE_SERVER=1, and fails it on any other error.
func need(tb testing.TB, err error) {
	tb.Helper()
	switch {
	case errors.Is(err, admittest.ErrNoServer) && os.Getenv("ADMIT_REQUIRE_SERVER") != "1":
		tally(tb, "skipped")
		tb.Skip(err, "(ADMIT_REQUIRE_SERVER=1 makes this a failure instead of a skip)")
	case err != nil:
		tb.Fatal(err)
	}
	tally(tb, "ran")
}

// Stop stops the servers this test binary shares (Shared, Cluster) and
// the embedded NATS server; Main calls it after the tests.
func Stop() {
	if shared.srv.Stop != nil {
		shared.srv.Stop()
	}
	if cluster.stop != nil {
		cluster.stop()
	}
	stopNATS()
}

// Client is a client of addrs (one server, or a cluster's nodes) without
// client-side caching, closed with the test.
func Client(tb testing.TB, addrs ...string) valkey.Client {
	tb.Helper()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		tb.Fatalf("dial %v: %v", addrs, err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Prefix is a key prefix of the test's own, with a hash tag, so that
// every key under it is in one cluster slot.
func Prefix(tb testing.TB) string {
	return fmt.Sprintf("outgress-test:{%s:%x}:", strings.ReplaceAll(tb.Name(), "/", "."), time.Now().UnixNano())
}

// Info parses the "name:value" lines of an INFO reply.
func Info(info string) map[string]string {
	m := map[string]string{}
	for line := range strings.Lines(strings.TrimPrefix(info, "txt:")) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}

// CmdStat is one command's counters in INFO commandstats.
type CmdStat struct{ Calls, Usec, Failed int64 }

// CommandStats is c's INFO commandstats by lower-case command name.
func CommandStats(tb testing.TB, c valkey.Client) map[string]CmdStat {
	tb.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	stats := map[string]CmdStat{}
	for k, v := range Info(info) {
		if name, ok := strings.CutPrefix(k, "cmdstat_"); ok {
			f := map[string]int64{} // calls=3,usec=120,usec_per_call=40.00,...
			for kv := range strings.SplitSeq(v, ",") {
				key, val, _ := strings.Cut(kv, "=")
				f[key], _ = strconv.ParseInt(val, 10, 64)
			}
			stats[name] = CmdStat{Calls: f["calls"], Usec: f["usec"], Failed: f["failed_calls"]}
		}
	}
	return stats
}

// tally appends "<outcome>\t<package dir>\t<test>" to ADMIT_SERVER_TALLY,
// when it is set, for the repository's make test, which counts the tests
// that ran on a server and those that skipped for want of one.
func tally(tb testing.TB, outcome string) {
	path := os.Getenv("ADMIT_SERVER_TALLY")
	if path == "" {
		return
	}
	dir, _ := os.Getwd()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	f.WriteString(outcome + "\t" + dir + "\t" + tb.Name() + "\n")
}
