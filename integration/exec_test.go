package integration

// Error classes on a real server: each failure mode is
// driven on a server the test starts, and a counter proves the class. The
// server's command statistics (calls and rejected calls of EVALSHA and
// EVAL) show whether the script command reached it, and the buckets are
// compared byte for byte (DUMP and PEXPIRETIME) before and after.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/admitkit/admit"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/delayproxy"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// ecScriptsSeen is how many script commands (EVALSHA and EVAL) the node
// behind c has executed or rejected so far.
func ecScriptsSeen(tb testing.TB, c valkey.Client) int64 {
	tb.Helper()
	stats := testserver.CommandStats(tb, c)
	var n int64
	for _, name := range []string{"evalsha", "eval"} {
		n += stats[name].Calls + stats[name].Rejected
	}
	return n
}

// ecRawKey is a key as the server holds it, byte for byte: its DUMP payload
// and its absolute expiry, or "absent".
func ecRawKey(tb testing.TB, c valkey.Client, key string) string {
	tb.Helper()
	ctx := context.Background()
	dump, err := c.Do(ctx, c.B().Dump().Key(key).Build()).ToString()
	if valkey.IsValkeyNil(err) {
		return "absent"
	}
	if err != nil {
		tb.Fatalf("DUMP %s: %v", key, err)
	}
	at, err := c.Do(ctx, c.B().Pexpiretime().Key(key).Build()).AsInt64()
	if err != nil {
		tb.Fatalf("PEXPIRETIME %s: %v", key, err)
	}
	return fmt.Sprintf("DUMP %q PEXPIRETIME %d", dump, at)
}

// ecWantClass fails the test unless err is in class want (and not in the
// other class), keeps cause in its chain, and its message contains every
// fragment and none of the forbidden ones.
func ecWantClass(tb testing.TB, err, want, cause error, fragments, forbidden []string) {
	tb.Helper()
	other := admit.ErrOutcomeUnknown
	if want == admit.ErrOutcomeUnknown {
		other = admit.ErrNotExecuted
	}
	if !errors.Is(err, want) || errors.Is(err, other) {
		tb.Errorf("err = %v; want %v only", err, want)
	}
	if cause != nil && !errors.Is(err, cause) {
		tb.Errorf("err = %v; want %v in its chain", err, cause)
	}
	if err == nil {
		return
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			tb.Errorf("message %q does not say %q", err.Error(), f)
		}
	}
	for _, f := range forbidden {
		if strings.Contains(err.Error(), f) {
			tb.Errorf("message %q says %q, which is not what happened", err.Error(), f)
		}
	}
}

// ecServer starts a server for this test alone, so that its command
// counters move only with the test's own commands.
func ecServer(t *testing.T, extra ...string) *testserver.Server {
	t.Helper()
	srv := testserver.Own(t, extra...)
	if !srv.Owned {
		t.Skip("counts the server's script commands exactly, so it needs a server the tests start")
	}
	return srv
}

func ecDial(t *testing.T, opt valkey.ClientOption) valkey.Client {
	t.Helper()
	c, err := valkey.NewClient(opt)
	if err != nil {
		t.Fatalf("dial %v: %v", opt.InitAddress, err)
	}
	t.Cleanup(c.Close)
	return c
}

// ecAwaitReconnect sends PINGs (which cannot take a token) through c
// until one fails with an error for which match holds: valkey-go has then
// noticed its connection was killed and has tried to open a new one. It
// returns that error.
func ecAwaitReconnect(t *testing.T, c valkey.Client, match func(error) bool) error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		last = c.Do(ctx, c.B().Ping().Build()).Error()
		cancel()
		if last != nil && match(last) {
			return last
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the client never reconnected with the expected failure; last PING: %v", last)
	return nil
}

// TestIntegrationErrClassCredentialsRefused: the client's connection is
// killed and its new connection's handshake (HELLO ... AUTH) is refused.
// valkey-go returns the handshake's error without sending the command,
// so the call is ErrNotExecuted: no script command reached the server
// and the bucket is unchanged, byte for byte.
func TestIntegrationErrClassCredentialsRefused(t *testing.T) {
	srv := ecServer(t)
	ctx := context.Background()
	bootstrap := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	for _, cmd := range [][]string{
		{"ACL", "SETUSER", "admin", "on", ">adminpw", "~*", "&*", "+@all"},
		{"ACL", "SETUSER", "rotated", "on", ">old", "~*", "&*", "+@all"},
		{"ACL", "SETUSER", "disabled", "on", ">pw", "~*", "&*", "+@all"},
	} {
		if err := bootstrap.Do(ctx, bootstrap.B().Arbitrary(cmd...).Build()).Error(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	admin := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, Username: "admin", Password: "adminpw", DisableCache: true, ForceSingleClient: true})

	for _, tc := range []struct {
		name, user, password string
		change               [][]string // what the operator does
		code                 string     // the handshake's error code
		says                 []string
	}{
		{"password rotated", "rotated", "old",
			[][]string{{"ACL", "SETUSER", "rotated", "resetpass", ">new"}},
			"WRONGPASS", []string{"not executed", "credentials", "nothing was sent"}},
		{"user disabled", "disabled", "pw",
			[][]string{{"ACL", "SETUSER", "disabled", "off"}},
			"WRONGPASS", []string{"not executed", "credentials", "nothing was sent"}},
		{"password required", "", "", // runs last: it gives the default user a password
			[][]string{{"CONFIG", "SET", "requirepass", "required"}},
			"NOAUTH", []string{"not executed", "authentication", "nothing ran"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One connection (PipelineMultiplex -1), so that the PINGs
			// that wait for the reconnection use the script's connection.
			c := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, Username: tc.user, Password: tc.password,
				DisableCache: true, ForceSingleClient: true, PipelineMultiplex: -1})
			l := admit.New(c)
			r := admit.Request{Key: "errclass:{auth}:" + strings.ReplaceAll(tc.name, " ", "-"), Spec: errclassSpec}
			if _, err := l.AllowOrdered(ctx, r, nil); err != nil {
				t.Fatalf("first call: %v", err)
			}
			for _, cmd := range tc.change {
				if err := admin.Do(ctx, admin.B().Arbitrary(cmd...).Build()).Error(); err != nil {
					t.Fatalf("%v: %v", cmd, err)
				}
			}
			if err := admin.Do(ctx, admin.B().Arbitrary("CLIENT", "KILL", "USER", ecUser(tc.user)).Build()).Error(); err != nil {
				t.Fatalf("CLIENT KILL: %v", err)
			}
			ecAwaitReconnect(t, c, func(err error) bool { return strings.Contains(err.Error(), tc.code) })
			before, calls := ecRawKey(t, admin, r.Key), ecScriptsSeen(t, admin)

			_, err := l.AllowOrdered(ctx, r, nil)
			t.Logf("error: %v", err)
			ecWantClass(t, err, admit.ErrNotExecuted, nil, tc.says, []string{"in flight"})
			if err == nil || !strings.Contains(err.Error(), tc.code) {
				t.Errorf("err = %v; want the server's %s in it", err, tc.code)
			}
			if n := ecScriptsSeen(t, admin) - calls; n != 0 {
				t.Errorf("the server saw %d script commands; want 0", n)
			}
			if after := ecRawKey(t, admin, r.Key); after != before {
				t.Errorf("bucket changed: %s -> %s", before, after)
			}
		})
	}
}

func ecUser(u string) string {
	if u == "" {
		return "default"
	}
	return u
}

// TestIntegrationErrClassTrackingRefused: with valkey-go's client-side
// cache on, the handshake also sends CLIENT TRACKING. When the user loses
// that permission, valkey-go wraps the refusal with valkey.ErrNoCache and
// sends nothing else: ErrNotExecuted, with the fix in the message.
func TestIntegrationErrClassTrackingRefused(t *testing.T) {
	srv := ecServer(t)
	ctx := context.Background()
	bootstrap := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	for _, cmd := range [][]string{
		{"ACL", "SETUSER", "admin", "on", ">adminpw", "~*", "&*", "+@all"},
		{"ACL", "SETUSER", "svc", "on", ">pw", "~*", "&*", "+@all"},
	} {
		if err := bootstrap.Do(ctx, bootstrap.B().Arbitrary(cmd...).Build()).Error(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	admin := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, Username: "admin", Password: "adminpw", DisableCache: true, ForceSingleClient: true})
	c := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, Username: "svc", Password: "pw", ForceSingleClient: true, PipelineMultiplex: -1})
	l := admit.New(c)
	r := admit.Request{Key: "errclass:{tracking}:r", Spec: errclassSpec}
	if _, err := l.AllowOrdered(ctx, r, nil); err != nil {
		t.Fatalf("first call: %v", err)
	}
	if err := admin.Do(ctx, admin.B().Arbitrary("ACL", "SETUSER", "svc", "-client|tracking").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, admin.B().Arbitrary("CLIENT", "KILL", "USER", "svc").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	ecAwaitReconnect(t, c, func(err error) bool { return errors.Is(err, valkey.ErrNoCache) })
	before, calls := ecRawKey(t, admin, r.Key), ecScriptsSeen(t, admin)

	_, err := l.AllowOrdered(ctx, r, nil)
	t.Logf("error: %v", err)
	ecWantClass(t, err, admit.ErrNotExecuted, valkey.ErrNoCache, []string{"not executed", "CLIENT TRACKING", "DisableCache"}, []string{"in flight"})
	if n := ecScriptsSeen(t, admin) - calls; n != 0 {
		t.Errorf("the server saw %d script commands; want 0", n)
	}
	if after := ecRawKey(t, admin, r.Key); after != before {
		t.Errorf("bucket changed: %s -> %s", before, after)
	}
}

// TestIntegrationErrClassNoSlot: on a cluster whose map has no node for a
// key's slot (as during a failover), valkey-go returns valkey.ErrNoSlot
// before sending anything: ErrNotExecuted. The cluster is one
// cluster-enabled server owning half the slots, with
// cluster-require-full-coverage off so that the other half is served.
func TestIntegrationErrClassNoSlot(t *testing.T) {
	srv := ecServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-require-full-coverage", "no")
	ctx := context.Background()
	node := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	if err := node.Do(ctx, node.B().Arbitrary("CLUSTER", "ADDSLOTSRANGE", "0", "8191").Build()).Error(); err != nil {
		t.Fatalf("CLUSTER ADDSLOTSRANGE: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := node.Do(ctx, node.B().ClusterInfo().Build()).ToString()
		if err == nil && testserver.InfoFields(info)["cluster_state"] == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not ok within 10s: %v %q", err, info)
		}
	}
	c := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if c.Mode() != valkey.ClientModeCluster {
		t.Fatalf("client mode %v, want cluster", c.Mode())
	}
	l := admit.New(c)
	var served, unserved admit.Request
	for i := 0; served.Key == "" || unserved.Key == ""; i++ {
		key := "errclass:{slot" + strconv.Itoa(i) + "}:r"
		slot, err := node.Do(ctx, node.B().ClusterKeyslot().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if slot < 8192 {
			served = admit.Request{Key: key, Spec: errclassSpec}
		} else {
			unserved = admit.Request{Key: key, Spec: errclassSpec}
		}
	}
	// The control: a key in a served slot is decided, and counted.
	calls := ecScriptsSeen(t, node)
	if _, err := l.AllowOrdered(ctx, served, nil); err != nil {
		t.Fatalf("key in a served slot: %v", err)
	}
	if n := ecScriptsSeen(t, node) - calls; n < 1 {
		t.Fatalf("the server counted %d script commands for a decided call; the counter proves nothing", n)
	}

	calls = ecScriptsSeen(t, node)
	_, err := l.AllowOrdered(ctx, unserved, nil)
	t.Logf("error: %v", err)
	ecWantClass(t, err, admit.ErrNotExecuted, valkey.ErrNoSlot, []string{"not executed", "slot", "nothing was sent"}, []string{"in flight"})
	if n := ecScriptsSeen(t, node) - calls; n != 0 {
		t.Errorf("the server saw %d script commands; want 0", n)
	}
	if got := ecRawKey(t, node, served.Key); got == "absent" {
		t.Errorf("the served bucket is absent")
	}
}

// TestIntegrationErrClassSharedDial: valkey-go opens one connection for
// all the callers that need it at once, with the context of the caller
// that started it. When that caller's deadline ends the connection
// attempt, every caller waiting on it gets that caller's "context
// deadline exceeded". Those callers' own contexts are fine and nothing
// of theirs was sent: ErrNotExecuted, and never "the context ended".
// The server counts exactly one script command per decided call.
func TestIntegrationErrClassSharedDial(t *testing.T) {
	srv := ecServer(t)
	// A link with some latency, so the handshake takes longer than the
	// impatient caller's deadline.
	proxy, err := delayproxy.Start(srv.Addr, 2*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	admin := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	ctx := context.Background()
	// Load the script, so every decided call is exactly one EVALSHA.
	if _, err := admit.New(admin).AllowOrdered(ctx, admit.Request{Key: "errclass:{dial}:warm", Spec: errclassSpec}, nil); err != nil {
		t.Fatal(err)
	}

	const patient, rounds = 15, 20
	var sharedFailures, decided, failedHealthy int
	for round := 0; round < rounds && sharedFailures == 0; round++ {
		// A cold client: its construction-time dial is refused, so the
		// first call opens the connection.
		var dials atomic.Int32
		dialing := make(chan struct{}, 1)
		c, _ := valkey.NewClient(valkey.ClientOption{InitAddress: []string{proxy.Addr()}, DisableCache: true, ForceSingleClient: true,
			PipelineMultiplex: -1, // one connection, one shared attempt to open it
			DialCtxFn: func(ctx context.Context, dst string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
				if dials.Add(1) == 1 {
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("refused by the test, to leave the client cold")}
				}
				select {
				case dialing <- struct{}{}:
				default:
				}
				return d.DialContext(ctx, "tcp", dst)
			}})
		if c == nil {
			t.Fatal("no client")
		}
		l := admit.New(c)
		prefix := "errclass:{dial" + strconv.Itoa(round) + "}:"
		calls := ecScriptsSeen(t, admin)

		impatient := make(chan error, 1)
		go func() {
			ictx, cancel := context.WithTimeout(ctx, time.Millisecond)
			defer cancel()
			_, err := l.AllowOrdered(ictx, admit.Request{Key: prefix + "impatient", Spec: errclassSpec}, nil)
			impatient <- err
		}()
		select {
		case <-dialing:
		case <-time.After(10 * time.Second):
			t.Fatal("the impatient caller never dialed")
		}
		errs := make([]error, patient)
		var wg sync.WaitGroup
		for i := range patient {
			wg.Go(func() {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				_, errs[i] = l.AllowOrdered(pctx, admit.Request{Key: prefix + strconv.Itoa(i), Spec: errclassSpec}, nil)
			})
		}
		wg.Wait()
		ierr := <-impatient
		roundDecided := 0
		for i, err := range errs {
			if err == nil {
				roundDecided++
				continue
			}
			failedHealthy++
			if errors.Is(err, context.DeadlineExceeded) {
				sharedFailures++
			}
			if failedHealthy <= 3 {
				t.Logf("round %d, caller %d (own deadline 5s, not passed): %v", round, i, err)
			}
			ecWantClass(t, err, admit.ErrNotExecuted, nil, []string{"not executed"}, []string{"in flight", "the context ended"})
			if got := ecRawKey(t, admin, prefix+strconv.Itoa(i)); got != "absent" {
				t.Errorf("round %d, caller %d: not executed, yet its bucket exists: %s", round, i, got)
			}
		}
		if ierr == nil {
			roundDecided++
		} else if round == 0 {
			t.Logf("the impatient caller (deadline 1ms): %v", ierr)
		}
		decided += roundDecided
		// On the closed client, valkey-go repeats the last error of a
		// connection attempt, or gives ErrClosing; either way it sends
		// nothing, and the class follows the error: another call's
		// context error is not executed, ErrClosing outcome unknown.
		c.Close()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, cerr := l.AllowOrdered(pctx, admit.Request{Key: prefix + "closed", Spec: errclassSpec}, nil)
		cancel()
		if round == 0 {
			t.Logf("called after Close: %v", cerr)
		}
		switch {
		case errors.Is(cerr, valkey.ErrClosing):
			ecWantClass(t, cerr, admit.ErrOutcomeUnknown, nil, []string{"closed"}, nil)
		case ecIsDial(cerr):
			ecWantClass(t, cerr, admit.ErrNotExecuted, nil, []string{"could not connect"}, []string{"in flight"})
		case errors.Is(cerr, context.DeadlineExceeded):
			ecWantClass(t, cerr, admit.ErrNotExecuted, nil, []string{"another call's context"}, []string{"in flight"})
		default:
			t.Errorf("called after Close: %v; want ErrClosing or a failed connection attempt's error", cerr)
		}
		if n := ecScriptsSeen(t, admin) - calls; n != int64(roundDecided) {
			t.Errorf("round %d: the server saw %d script commands for %d decided calls", round, n, roundDecided)
		}
	}
	t.Logf("%d patient callers failed (%d with another caller's deadline); %d calls decided", failedHealthy, sharedFailures, decided)
	if sharedFailures == 0 {
		t.Fatalf("in %d rounds no patient caller got the impatient caller's deadline; the test proved nothing", rounds)
	}
}

func ecIsDial(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// ecHoldProxy relays one client's connections to a server, and once hold is
// set it swallows every reply: the server runs what it is sent, and the
// client never hears back.
type ecHoldProxy struct {
	ln     net.Listener
	target string
	hold   atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func ecStartHoldProxy(t *testing.T, target string) *ecHoldProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &ecHoldProxy{ln: ln, target: target}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); io.Copy(server, client); server.Close() }()
			go func() {
				defer p.wg.Done()
				defer client.Close()
				buf := make([]byte, 4096)
				for {
					n, err := server.Read(buf)
					if n > 0 && !p.hold.Load() {
						if _, err := client.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// TestIntegrationErrClassClosing: valkey.ErrClosing does not prove that
// nothing ran. A call whose script the server has run, and whose reply is
// still on its way, gets ErrClosing when the client is closed under it
// (valkey-go fails every pending call with ErrClosing once Close has
// waited a second for their replies). So ErrClosing is ErrOutcomeUnknown,
// and the message says that the client was closed. A call made on a
// client already closed sends nothing (counted too), and says the same.
func TestIntegrationErrClassClosing(t *testing.T) {
	srv := ecServer(t)
	ctx := context.Background()
	admin := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	proxy := ecStartHoldProxy(t, srv.Addr)
	// One connection, and no background PING: only the call and Close act
	// on it.
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{proxy.ln.Addr().String()}, DisableCache: true,
		ForceSingleClient: true, PipelineMultiplex: -1, Dialer: net.Dialer{KeepAlive: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := admit.New(c)
	r := admit.Request{Key: "errclass:{closing}:r", Spec: errclassSpec}
	if _, err := l.AllowOrdered(ctx, r, nil); err != nil { // loads the script
		t.Fatal(err)
	}
	before, calls := ecRawKey(t, admin, r.Key), ecScriptsSeen(t, admin)

	proxy.hold.Store(true)
	done := make(chan error, 1)
	callCtx, cancel := context.WithCancel(ctx) // a context with Done and no deadline: valkey-go's pipelined path
	defer cancel()
	go func() {
		_, err := l.AllowOrdered(callCtx, r, nil)
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ecScriptsSeen(t, admin) == calls; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the script command never reached the server")
		}
	}
	c.Close()
	var inFlight error
	select {
	case inFlight = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return after Close")
	}
	t.Logf("closed in flight: %v", inFlight)
	if n := ecScriptsSeen(t, admin) - calls; n != 1 {
		t.Errorf("the server saw %d script commands; want 1", n)
	}
	if after := ecRawKey(t, admin, r.Key); after == before {
		t.Errorf("the bucket did not change, so this run does not show a script that ran")
	}
	ecWantClass(t, inFlight, admit.ErrOutcomeUnknown, valkey.ErrClosing, []string{"outcome unknown", "closed"}, nil)

	calls = ecScriptsSeen(t, admin)
	before = ecRawKey(t, admin, r.Key)
	_, afterClose := l.AllowOrdered(ctx, r, nil)
	t.Logf("called after Close: %v", afterClose)
	ecWantClass(t, afterClose, admit.ErrOutcomeUnknown, valkey.ErrClosing, []string{"outcome unknown", "closed"}, nil)
	if n := ecScriptsSeen(t, admin) - calls; n != 0 {
		t.Errorf("the server saw %d script commands after Close; want 0", n)
	}
	if after := ecRawKey(t, admin, r.Key); after != before {
		t.Errorf("bucket changed after Close: %s -> %s", before, after)
	}
}

// TestIntegrationErrClassNoScriptingEngine: a server without the Lua
// engine. Valkey 9.1 runs Lua as a module (built in, loaded at start); an
// operator with the MODULE command can unload it, after which the server
// has dropped its script cache and answers EVAL and EVAL_RO (valkey-go's
// fallback from NOSCRIPT) with "ERR Could not find scripting engine 'lua'"
// (9.1.2), before running anything. Every call must then fail as not
// executed, saying scripting is unavailable and how to get it back, and
// write nothing. Skips on servers with Lua linked in (Valkey before 9.1,
// Redis), which cannot run without it.
func TestIntegrationErrClassNoScriptingEngine(t *testing.T) {
	srv := ecServer(t, "--enable-module-command", "yes")
	ctx := context.Background()
	admin := ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	modules, err := admin.Do(ctx, admin.B().ModuleList().Build()).ToAny()
	if err != nil {
		t.Fatalf("MODULE LIST: %v", err)
	}
	if !strings.Contains(fmt.Sprint(modules), "lua") {
		t.Skipf("%s has no Lua engine module to unload (MODULE LIST: %v): Lua is linked into the server", srv.Version, modules)
	}
	l := admit.New(ecDial(t, valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true}))
	first := admit.Request{Key: "errclass:{nolua}:first", Spec: errclassSpec}
	second := admit.Request{Key: "errclass:{nolua}:second", Spec: errclassSpec}
	if d, err := l.AllowOrdered(ctx, first, &second); err != nil || !d.Allowed() {
		t.Fatalf("before the unload: %v, %v; want allowed", d, err)
	}
	if err := admin.Do(ctx, admin.B().ModuleUnload().Name("lua").Build()).Error(); err != nil {
		t.Fatalf("MODULE UNLOAD lua: %v", err)
	}
	record, err := admit.OnceRecordKey(first.Key, "nolua-id")
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{first.Key, second.Key, record}
	state := func() string {
		var b strings.Builder
		for _, k := range keys {
			b.WriteString(k + ": " + ecRawKey(t, admin, k) + "\n")
		}
		return b.String()
	}
	before := state()
	for _, call := range []struct {
		name string
		do   func() error
	}{
		{"AllowOrdered", func() error { _, err := l.AllowOrdered(ctx, first, &second); return err }},
		{"AllowOrdered one bucket", func() error { _, err := l.AllowOrdered(ctx, first, nil); return err }},
		{"AllowOrderedOnce", func() error { _, err := l.AllowOrderedOnce(ctx, "nolua-id", first, &second); return err }},
		{"Peek", func() error { _, err := l.Peek(ctx, first, &second); return err }},
		{"Refund", func() error { return l.Refund(ctx, first, &second) }},
	} {
		t.Run(call.name, func(t *testing.T) {
			err := call.do()
			t.Logf("error: %v", err)
			ecWantClass(t, err, admit.ErrNotExecuted, nil,
				[]string{"not executed", "no Lua scripting engine", "nothing ran", "Could not find scripting engine 'lua'"},
				[]string{"may have been consumed"})
			if after := state(); after != before {
				t.Errorf("keys changed:\n%s->\n%s", before, after)
			}
		})
	}
}
