package testenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// ServerHelp says how to give the tests a server.
const ServerHelp = "no valkey-server: set VALKEY_SERVER=/path/to/valkey-server or put valkey-server (or redis-server) on PATH; " +
	"ADMIT_REQUIRE_SERVER=1 makes this a failure instead of a skip"

// A Server is a valkey-server (or redis-server) the tests started on
// 127.0.0.1 at a free port, without persistence. Its keys are the tests'
// alone: nothing needs cleaning up, it goes away with Stop.
type Server struct {
	Addr    string
	cmd     *exec.Cmd
	dir     string
	exited  chan struct{}
	stopped sync.Once
}

// ServerBinary is VALKEY_SERVER, else valkey-server, then redis-server,
// found on PATH; "" when there is none.
func ServerBinary() string {
	if bin := os.Getenv("VALKEY_SERVER"); bin != "" {
		return bin
	}
	for _, name := range []string{"valkey-server", "redis-server"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// SkipOrFail skips the test for want of a server, or fails it when
// ADMIT_REQUIRE_SERVER=1.
func SkipOrFail(tb testing.TB) {
	tb.Helper()
	if os.Getenv("ADMIT_REQUIRE_SERVER") == "1" {
		tb.Fatal(ServerHelp)
	}
	tally(tb, "skipped")
	tb.Skip(ServerHelp)
}

// StartServer starts bin with the extra arguments and waits, at most
// 10 s, until it answers PING. The caller stops it.
func StartServer(bin string, extra ...string) (*Server, error) {
	var err error
	for range 3 { // a free port may be taken between the probe and the bind
		var s *Server
		if s, err = startServer(bin, extra); err == nil {
			return s, nil
		}
	}
	return nil, err
}

func startServer(bin string, extra []string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outgress-valkey-")
	if err != nil {
		return nil, err
	}
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--loglevel", "warning", "--logfile", filepath.Join(dir, "log")}, extra...)
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: exec.Command(bin, args...), dir: dir, exited: make(chan struct{})}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() { s.cmd.Wait(); close(s.exited) }()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case <-s.exited:
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("%s %s exited at start: %s", bin, strings.Join(args, " "), log)
		default:
		}
		if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
			_, err = c.Write([]byte("PING\r\n"))
			line := ""
			if err == nil {
				c.SetReadDeadline(time.Now().Add(time.Second))
				line, _ = bufio.NewReader(c).ReadString('\n')
			}
			c.Close()
			if strings.HasPrefix(line, "+PONG") {
				return s, nil
			}
		}
	}
	s.Stop()
	return nil, fmt.Errorf("%s did not answer on %s within 10s", bin, s.Addr)
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.stopped.Do(func() {
		s.cmd.Process.Kill()
		<-s.exited
		os.RemoveAll(s.dir)
	})
}

// FreePort is a TCP port free on 127.0.0.1 when asked.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Shared is the test binary's server, started by its first caller and
// stopped by Stop (call it from TestMain). Tests on it keep apart by key
// prefix (Prefix).
func Shared(tb testing.TB) *Server {
	tb.Helper()
	bin := ServerBinary()
	if bin == "" {
		SkipOrFail(tb)
	}
	shared.once.Do(func() { shared.srv, shared.err = StartServer(bin) })
	if shared.err != nil {
		tb.Fatalf("server: %v", shared.err)
	}
	tally(tb, "ran")
	return shared.srv
}

// Own starts a server of the test's own, stopped with the test: for
// tests that stop it, flush its scripts or change its configuration.
func Own(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	bin := ServerBinary()
	if bin == "" {
		SkipOrFail(tb)
	}
	s, err := StartServer(bin, extra...)
	if err != nil {
		tb.Fatalf("server: %v", err)
	}
	tb.Cleanup(s.Stop)
	tally(tb, "ran")
	return s
}

// Stop stops the servers this test binary shares (Shared, Cluster) and
// the embedded NATS server; call it from TestMain after the tests.
func Stop() {
	if shared.srv != nil {
		shared.srv.Stop()
	}
	for _, s := range cluster.servers {
		s.Stop()
	}
	StopNATS()
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

var cluster struct {
	once    sync.Once
	servers []*Server
	err     error
}

// Cluster is the addresses of a 3-primary Valkey Cluster, started by its
// first caller and stopped by Stop.
func Cluster(tb testing.TB) []string {
	tb.Helper()
	bin := ServerBinary()
	if bin == "" {
		SkipOrFail(tb)
	}
	cluster.once.Do(func() { cluster.servers, cluster.err = startCluster(bin, 3) })
	if cluster.err != nil {
		tb.Fatalf("cluster: %v", cluster.err)
	}
	tally(tb, "ran")
	addrs := make([]string, len(cluster.servers))
	for i, s := range cluster.servers {
		addrs[i] = s.Addr
	}
	return addrs
}

// startCluster starts n cluster-enabled servers, gives each an equal range
// of the slots, joins them, and waits, at most 30 s, until each says
// cluster_state:ok and knows every node.
func startCluster(bin string, n int) (servers []*Server, err error) {
	defer func() {
		if err != nil {
			for _, s := range servers {
				s.Stop()
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var clients []valkey.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	var buses []string
	for i := range n {
		bus, err := FreePort()
		if err != nil {
			return servers, err
		}
		s, err := StartServer(bin, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", strconv.Itoa(bus))
		if err != nil {
			return servers, err
		}
		servers, buses = append(servers, s), append(buses, strconv.Itoa(bus))
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			return servers, err
		}
		clients = append(clients, c)
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if err := c.Do(ctx, c.B().Arbitrary("CLUSTER", "ADDSLOTSRANGE").Args(strconv.Itoa(lo), strconv.Itoa(hi)).Build()).Error(); err != nil {
			return servers, fmt.Errorf("CLUSTER ADDSLOTSRANGE on %s: %w", s.Addr, err)
		}
	}
	for i, s := range servers[1:] {
		host, port, _ := strings.Cut(s.Addr, ":")
		if err := clients[0].Do(ctx, clients[0].B().Arbitrary("CLUSTER", "MEET").Args(host, port, buses[i+1]).Build()).Error(); err != nil {
			return servers, fmt.Errorf("CLUSTER MEET %s: %w", s.Addr, err)
		}
	}
	for ready := 0; ready < n; time.Sleep(50 * time.Millisecond) {
		if ctx.Err() != nil {
			return servers, fmt.Errorf("cluster not ready within 30s (%d of %d nodes)", ready, n)
		}
		ready = 0
		for _, c := range clients {
			info, _ := c.Do(ctx, c.B().ClusterInfo().Build()).ToString()
			if f := Info(info); f["cluster_state"] == "ok" && f["cluster_known_nodes"] == strconv.Itoa(n) {
				ready++
			}
		}
	}
	return servers, nil
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
