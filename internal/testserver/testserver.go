// Package testserver finds or starts the real Valkey (or Redis) servers that
// admit's tests, benchmarks and examples run against.
//
// Server selection for [Shared], in order:
//
//	VALKEY_ADDR=host:port     an existing server; tests never flush it
//	VALKEY_IMAGE=image:tag    a container, started by [StartImage] (set by the
//	                          internal/containertest module, the only one
//	                          that needs a container runtime)
//	VALKEY_SERVER=/path/bin   a valkey-server or redis-server binary to start
//	valkey-server, then redis-server, found on PATH
//
// [Deployment], which the conformance suite runs against, first honours
//
//	VALKEY_CLUSTER_ADDR=h:p,...  an existing cluster; tests never flush it
//	VALKEY_CLUSTER=1             a 3-primary cluster of the binary above,
//	                             started on 127.0.0.1 and stopped at the end
//
// and otherwise uses [Shared]. With none of these, tests skip, saying how to
// provide one, unless ADMIT_REQUIRE_SERVER=1, where they fail.
package testserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/admitkit/admit/internal/serverinfo"
)

// Help says how to provide a server.
const Help = "no Valkey server: set VALKEY_ADDR=host:port, or VALKEY_SERVER=/path/to/valkey-server, " +
	"or put valkey-server (or redis-server) on PATH, or set VALKEY_IMAGE=valkey/valkey:8.0 where Docker runs " +
	"(for the tests of the internal/containertest module) " +
	"(VALKEY_CLUSTER=1 or VALKEY_CLUSTER_ADDR=host:port,... for a cluster); ADMIT_REQUIRE_SERVER=1 makes this a failure"

// Server is a server the tests talk to.
type Server struct {
	Addr string
	// Owned is true when the tests started the server themselves, so checks
	// that flush scripts or change config may run on it.
	Owned bool
	// Version is the server's "valkey_version" or "redis_version".
	Version string
	// TLS is the client configuration for a server started by StartTLS
	// (it trusts the server's test certificate); nil for plain TCP.
	TLS *tls.Config

	cmd     *exec.Cmd
	dir     string
	logPath string
	exited  chan struct{}
	stop    func() // for a container
}

// StartImage starts a server from a container image for VALKEY_IMAGE and
// returns its address and a function that removes it. It is nil in this
// module, which stays free of container runtimes: the internal/containertest
// module, whose tests run the conformance suite in containers, sets it. An
// error wrapping [ErrNoEngine] skips the test (fails it under
// ADMIT_REQUIRE_SERVER=1).
var StartImage func(ctx context.Context, image string) (addr string, stop func(), err error)

// ErrNoEngine says that no container engine answers.
var ErrNoEngine = errors.New("no container engine answers")

// Required reports whether ADMIT_REQUIRE_SERVER=1: no server is then a failure.
func Required() bool { return os.Getenv("ADMIT_REQUIRE_SERVER") == "1" }

// SkipOrFail skips the test with msg, or fails it when a server is required.
func SkipOrFail(tb testing.TB, msg string) {
	tb.Helper()
	if Required() {
		tb.Fatal(msg)
	}
	tally(tb, "skipped")
	tb.Skip(msg)
}

// Binary returns the server binary to start, or "" when there is none.
func Binary() string {
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

// once is a value made at most once, by the first get.
type once[T any] struct {
	sync.Once
	v   T
	err error
}

func (o *once[T]) get(make func() (T, error)) (T, error) {
	o.Do(func() { o.v, o.err = make() })
	return o.v, o.err
}

// shared is the test binary's server; nil without one.
var shared once[*Server]

// Shared returns the test binary's server: VALKEY_ADDR, or one server
// started once and stopped by StopShared (call it from TestMain). Tests on
// it isolate themselves by key prefix.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	srv, err := shared.get(func() (*Server, error) {
		if addr := os.Getenv("VALKEY_ADDR"); addr != "" {
			return dialExisting(addr)
		}
		if image := os.Getenv("VALKEY_IMAGE"); image != "" {
			return startImage(image)
		}
		if bin := Binary(); bin != "" {
			return Start(bin)
		}
		return nil, nil
	})
	if errors.Is(err, ErrNoEngine) {
		SkipOrFail(tb, err.Error())
	}
	if err != nil {
		tb.Fatalf("server: %v", err)
	}
	if srv == nil {
		SkipOrFail(tb, Help)
	}
	tally(tb, "ran")
	return srv
}

// Own starts a fresh server for checks that change server-wide state
// (SCRIPT FLUSH, CONFIG SET, DEBUG). On a server given by VALKEY_ADDR such
// checks skip unless VALKEY_ALLOW_DESTRUCTIVE=1, and say so.
func Own(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	if addr := os.Getenv("VALKEY_ADDR"); addr != "" {
		if len(extra) > 0 {
			tb.Skipf("needs a server started with %v; skipped on VALKEY_ADDR", extra)
		}
		if os.Getenv("VALKEY_ALLOW_DESTRUCTIVE") != "1" {
			tb.Skip("changes server-wide state (script cache, config); skipped on VALKEY_ADDR unless VALKEY_ALLOW_DESTRUCTIVE=1")
		}
		return Shared(tb)
	}
	bin := Binary()
	if bin == "" {
		SkipOrFail(tb, Help)
	}
	srv, err := Start(bin, extra...)
	if err != nil {
		tb.Fatalf("server: %v", err)
	}
	tb.Cleanup(srv.Stop)
	tally(tb, "ran")
	return srv
}

// OwnReplicated starts a fresh primary and a replica of it, both stopped
// when the test ends, and waits (at most 10 s) until the replica has
// synced: its link to the primary is up and no sync is in progress. The
// primary starts a diskless full sync at once (Valkey 8 waits 5 s by
// default).
func OwnReplicated(tb testing.TB) (primary, replica *Server) {
	tb.Helper()
	primary = Own(tb, "--repl-diskless-sync-delay", "0")
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica = Own(tb, "--replicaof", host, port)
	c := NewClient(tb, replica)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		info, err := c.Do(ctx, c.B().Info().Section("replication").Build()).ToString()
		f := InfoFields(info)
		if err == nil && f["master_link_status"] == "up" && f["master_sync_in_progress"] == "0" {
			return primary, replica
		}
		if ctx.Err() != nil {
			tb.Fatalf("the replica %s did not sync with %s within 10s: %v, master_link_status:%s", replica.Addr, primary.Addr, err, f["master_link_status"])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startImage starts image through StartImage and returns it as an owned
// server, removed by Stop.
func startImage(image string) (*Server, error) {
	if StartImage == nil {
		return nil, fmt.Errorf("VALKEY_IMAGE=%s: container images are run by the tests of the internal/containertest module "+
			"(cd internal/containertest && go test ./...), not by this one", image)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	addr, stop, err := StartImage(ctx, image)
	if err != nil {
		return nil, fmt.Errorf("VALKEY_IMAGE=%s: %w", image, err)
	}
	v, err := serverVersion(addr)
	if err != nil {
		stop()
		return nil, fmt.Errorf("VALKEY_IMAGE=%s at %s: %w", image, addr, err)
	}
	return &Server{Addr: addr, Owned: true, Version: v, stop: stop}, nil
}

func dialExisting(addr string) (*Server, error) {
	srv := &Server{Addr: addr}
	v, err := serverVersion(addr)
	if err != nil {
		return nil, fmt.Errorf("VALKEY_ADDR=%s: %w", addr, err)
	}
	srv.Version = v
	return srv, nil
}

// Start starts bin on 127.0.0.1 at a free port, without persistence,
// and waits (at most 10 s) until it answers. The caller stops it.
func Start(bin string, extra ...string) (*Server, error) {
	return StartEnv(bin, nil, extra...)
}

// StartEnv is Start with env added to the server's environment.
func StartEnv(bin string, env []string, extra ...string) (*Server, error) {
	return start(bin, env, extra, nil)
}

func start(bin string, env, extra []string, tlsFiles func(dir string) (*tls.Config, []string, error)) (*Server, error) {
	var err error
	for range 3 { // a free port may be taken between the probe and the bind
		var srv *Server
		if srv, err = tryStartServer(bin, env, extra, tlsFiles); err == nil {
			return srv, nil
		}
	}
	return nil, err
}

// tryStartServer starts bin with env added to its environment; with
// tlsFiles, which writes certificates into the server's directory and
// returns the client configuration and the server's TLS arguments, the
// server listens for TLS only.
func tryStartServer(bin string, env, extra []string, tlsFiles func(dir string) (*tls.Config, []string, error)) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "admit-server-")
	if err != nil {
		return nil, err
	}
	var tlsConfig *tls.Config
	portArgs := []string{"--port", strconv.Itoa(port)}
	if tlsFiles != nil {
		cfg, args, err := tlsFiles(dir)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		tlsConfig = cfg
		portArgs = append([]string{"--port", "0", "--tls-port", strconv.Itoa(port)}, args...)
	}
	logPath := filepath.Join(dir, "server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer logf.Close()
	args := append(append(portArgs,
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--loglevel", "warning",
	), extra...)
	// The cluster bus defaults to port+10000, which may be taken or beyond
	// 65535; give it a free port of its own.
	if slices.Contains(extra, "--cluster-enabled") && !slices.Contains(extra, "--cluster-port") {
		busPort, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		args = append(args, "--cluster-port", strconv.Itoa(busPort))
	}
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = serverProcAttr()
	cmd.Stdout, cmd.Stderr = logf, logf
	exited := make(chan struct{})
	if err := startAndWatch(cmd, exited); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	srv := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Owned: true, TLS: tlsConfig, cmd: cmd, dir: dir, logPath: logPath, exited: exited}
	if err := srv.awaitStart(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return srv, nil
}

// awaitStart waits (at most 10 s) until the server s.cmd runs answers,
// and sets s.Version; it stops the server when it does not answer.
func (s *Server) awaitStart() error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case <-s.exited:
			log, _ := os.ReadFile(s.logPath)
			return fmt.Errorf("%s exited at start: %s", strings.Join(s.cmd.Args, " "), strings.TrimSpace(string(log)))
		default:
		}
		if v, err := serverVersionTLS(s.Addr, s.TLS); err == nil {
			s.Version = v
			return nil
		}
	}
	s.cmd.Process.Kill()
	<-s.exited
	return fmt.Errorf("%s did not answer on %s within 10s", s.cmd.Args[0], s.Addr)
}

// Crash kills a server the tests started with SIGKILL, as kill -9 does,
// and returns once the process is gone: the kernel has closed its sockets,
// so each client connection has received the server's FIN. Its directory
// stays, for Restart.
func (s *Server) Crash() error {
	if s.cmd == nil {
		return errors.New("testserver: Crash needs a server the tests started as a process")
	}
	if err := s.cmd.Process.Kill(); err != nil { // SIGKILL
		return err
	}
	<-s.exited
	return nil
}

// Restart starts the server again after Crash, with the same binary,
// arguments, environment, port and directory, and waits (at most 10 s)
// until it answers on a connection of its own.
func (s *Server) Restart() error {
	if s.cmd == nil {
		return errors.New("testserver: Restart needs a server the tests started as a process")
	}
	select {
	case <-s.exited:
	default:
		return errors.New("testserver: Restart of a server that is still running; Crash it first")
	}
	logf, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.cmd.Path, s.cmd.Args[1:]...)
	cmd.Env = s.cmd.Env
	cmd.SysProcAttr = serverProcAttr()
	cmd.Stdout, cmd.Stderr = logf, logf
	exited := make(chan struct{})
	if err := startAndWatch(cmd, exited); err != nil {
		return fmt.Errorf("restart %s: %w", s.cmd.Path, err)
	}
	s.cmd, s.exited = cmd, exited
	return s.awaitStart()
}

// Stop kills a server the tests started and removes its directory.
func (s *Server) Stop() {
	if s.stop != nil {
		s.stop()
		return
	}
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exited
	os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// serverVersion asks addr for its version, within 2 s.
func serverVersion(addr string) (string, error) { return serverVersionTLS(addr, nil) }

func serverVersionTLS(addr string, tlsConfig *tls.Config) (string, error) {
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, TLSConfig: tlsConfig, DisableCache: true, DisableRetry: true})
	if err != nil {
		return "", err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.Do(ctx, c.B().Info().Section("server").Build()).ToString()
	if err != nil {
		return "", err
	}
	fields := InfoFields(info)
	if v := fields["valkey_version"]; v != "" {
		return "valkey " + v, nil
	}
	return "redis " + fields["redis_version"], nil
}

// NewClient returns a client for srv, closed at the end of the test.
func NewClient(tb testing.TB, srv *Server) valkey.Client {
	tb.Helper()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, TLSConfig: srv.TLS, DisableCache: true})
	if err != nil {
		tb.Fatalf("dial %s: %v", srv.Addr, err)
	}
	tb.Cleanup(c.Close)
	tally(tb, "ran")
	return c
}

// CmdStat is one command's line of INFO commandstats.
type CmdStat = serverinfo.CmdStat

// InfoFields parses the "name:value" lines of an INFO reply.
func InfoFields(info string) map[string]string { return serverinfo.Fields(info) }

// CommandStats returns INFO commandstats by lower-case command name
// ("evalsha", "eval", "ping", ...). On Valkey 8 and Redis 7 the counters
// are per node, so read them from the node that served the calls.
func CommandStats(tb testing.TB, c valkey.Client) serverinfo.Stats {
	tb.Helper()
	stats, err := ReadCommandStats(context.Background(), c)
	if err != nil {
		tb.Fatal(err)
	}
	return stats
}

// ReadCommandStats is CommandStats for callers that report errors
// themselves.
func ReadCommandStats(ctx context.Context, c valkey.Client) (serverinfo.Stats, error) {
	return serverinfo.CommandStats(ctx, c)
}

// Prefix returns a key prefix unique to this test, with a hash tag so
// that every key under it lands in one cluster slot, and deletes the test's
// keys (and only those) at the end.
func Prefix(tb testing.TB, c valkey.Client) string {
	tb.Helper()
	p := fmt.Sprintf("admit-test:{%s:%x}:", strings.ReplaceAll(tb.Name(), "/", "."), time.Now().UnixNano())
	tb.Cleanup(func() { DeleteWithPrefix(c, p) })
	return p
}

// DeleteWithPrefix deletes every key that starts with prefix, on every
// node of c, and nothing else. prefix must hold no glob characters.
func DeleteWithPrefix(c valkey.Client, prefix string) { serverinfo.DeleteWithPrefix(c, prefix) }

// Main runs a test binary's tests and stops the shared servers after the
// last: a package's TestMain is testserver.Main(m).
func Main(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

// StopShared stops the shared server and cluster, if this test binary
// started them.
func StopShared() {
	if shared.v != nil {
		shared.v.Stop()
	}
	if sharedCluster.v != nil {
		sharedCluster.v.Stop()
	}
}

// startAndWatch starts cmd and closes exited when it ends. Linux sends the
// Pdeathsig of serverProcAttr when the thread that started the process
// exits, not the process, so the start happens on a locked thread that
// stays alive, waiting, until the server is gone.
func startAndWatch(cmd *exec.Cmd, exited chan struct{}) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends after the server
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(exited)
	}()
	return <-started
}
