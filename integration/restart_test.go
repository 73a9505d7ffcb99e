package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// restartRounds and afterRestart are the crash-and-restart test's size:
// rounds of kill -9 and restart, and the calls sent after each restart.
const (
	restartRounds = 4
	afterRestart  = 8
)

// restartDecisionTimeout is each call's deadline, as admithttp's
// WithDecisionTimeout in the README gives it.
const restartDecisionTimeout = 500 * time.Millisecond

// restartCounts are the calls sent after a restart, by class, and where
// their commands went on the wire.
type restartCounts struct {
	decided, notExecuted, unknown int
	leftover                      int // outcome unknown among the next round's traffic: connections these calls did not use
	decidedRan, unknownRan        int // decided and unknown calls whose key the new server holds
	causes                        map[string]int
	live, dead                    int // script commands that reached a live server connection, and a dead one (proxy only)
}

func (c *restartCounts) add(o restartCounts) {
	c.decided += o.decided
	c.notExecuted += o.notExecuted
	c.unknown += o.unknown
	c.leftover += o.leftover
	c.decidedRan += o.decidedRan
	c.unknownRan += o.unknownRan
	c.live += o.live
	c.dead += o.dead
}

func (c restartCounts) String() string {
	s := fmt.Sprintf("decided %d, not executed %d, outcome unknown %d", c.decided, c.notExecuted, c.unknown)
	if len(c.causes) > 0 {
		s += fmt.Sprintf(" %v", c.causes)
	}
	return s
}

// restartClient is a client configuration of the crash-and-restart test,
// and the most calls after a restart that may fail, each with its command
// written to a connection that died with the old server: one per idle
// connection the client holds.
type restartClient struct {
	name      string
	option    func(addr string) valkey.ClientOption
	maxFailed int
}

var restartClients = []restartClient{
	// The README's client: the background reader of each connection
	// reads the FIN of a dead server when it arrives, and valkey-go
	// replaces the connection before any later call picks it.
	{"AlwaysPipelining (README)", func(addr string) valkey.ClientOption {
		return valkey.ClientOption{InitAddress: []string{addr}, AlwaysPipelining: true}
	}, 0},
	// valkey-go's defaults: a connection used by one call at a time is
	// read only while a call waits on it, so nothing reads a dead
	// server's FIN, and the next call on each such connection writes its
	// command to it and reads EOF.
	{"default options", func(addr string) valkey.ClientOption {
		return valkey.ClientOption{InitAddress: []string{addr}}
	}, pipelineWires()},
	// A connection per call in flight, from a pool: the test's sequential
	// calls keep one.
	{"DisableAutoPipelining", func(addr string) valkey.ClientOption {
		return valkey.ClientOption{InitAddress: []string{addr}, DisableAutoPipelining: true}
	}, 1},
}

// pipelineWires is the number of connections valkey-go v1.0.79's client
// to one server multiplexes calls over by default: 2^PipelineMultiplex,
// PipelineMultiplex being log2(GOMAXPROCS) rounded down, at most 2
// (valkey.go singleClientMultiplex); a call with keys picks one at random
// (mux.go slotfn).
func pipelineWires() int {
	m := 0
	for p := runtime.GOMAXPROCS(0); p >= 2 && m < 2; p /= 2 {
		m++
	}
	return 1 << m
}

// TestCrashRestart measures what calls sent after a store's kill -9 and
// restart get: 4 rounds of traffic, kill -9, a restart on the same port
// (awaited on a connection of its own), then 8 sequential calls on one
// long-lived Limiter, each with its own new key, so that whether it ran on
// the new server shows in whether its key exists there. Directly, and
// through a proxy that shows whether each failed call's command reached a
// live server connection or was written after its connection's server
// side had ended. For each client configuration it requires what
// checkRestartRound says: with the README's, every call after a restart
// decided; with the others, at most one outcome-unknown call per idle
// connection, none of which reached the new server (docs/errors.md).
func TestCrashRestart(t *testing.T) {
	if os.Getenv("VALKEY_ADDR") != "" {
		t.Skip("kills and restarts its own server; skipped on VALKEY_ADDR")
	}
	for _, rc := range restartClients {
		for _, viaProxy := range []bool{false, true} {
			name := rc.name
			if viaProxy {
				name += ", via proxy"
			}
			t.Run(name, func(t *testing.T) {
				srv := testserver.Own(t)
				addr := srv.Addr
				var proxy *countProxy
				if viaProxy {
					var err error
					if proxy, err = startCountProxy(srv.Addr); err != nil {
						t.Fatal(err)
					}
					defer proxy.close()
					addr = proxy.addr()
				}
				c, err := valkey.NewClient(rc.option(addr))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				l := admit.New(c)
				var total restartCounts
				var prev *restartCounts // the last round, until the next traffic has found its dead connections
				var live0, dead0 int
				for round := 0; ; round++ {
					left := restartTraffic(t, srv, l, round)
					if prev == nil && left.unknown != 0 {
						t.Fatalf("traffic before the first crash: %v", left)
					}
					if prev != nil {
						prev.leftover, prev.unknownRan = left.unknown, prev.unknownRan+left.unknownRan
						for cause, n := range left.causes {
							prev.causes[cause] += n
						}
						if proxy != nil {
							live1, dead1 := proxy.scriptCommands()
							prev.live, prev.dead = live1-live0, dead1-dead0
						}
						t.Logf("%s, %s, round %d: %d calls after the restart: %v; the next %d calls found %d more dead connections; "+
							"script commands (through the proxy) to a live connection %d, to a connection of the dead server %d",
							srv.Version, name, round, afterRestart, *prev, trafficCalls, prev.leftover, prev.live, prev.dead)
						checkRestartRound(t, rc, proxy != nil, round-1, *prev)
						total.add(*prev)
					}
					if round == restartRounds {
						break
					}
					if err := srv.Crash(); err != nil {
						t.Fatal(err)
					}
					if err := srv.Restart(); err != nil {
						t.Fatal(err)
					}
					if proxy != nil {
						live0, dead0 = proxy.scriptCommands()
					}
					got := afterRestartCalls(t, srv, l, round)
					prev = &got
				}
				t.Logf("%s, %s, total: %d calls after %d restarts: %v; %d more dead connections found by the next calls; script commands to a dead connection: %d",
					srv.Version, name, restartRounds*afterRestart, restartRounds, total, total.leftover, total.dead)
			})
		}
	}
}

// trafficCalls is the number of calls of restartTraffic.
const trafficCalls = 20

// restartCall is one call of TestCrashRestart, on its own new key.
func restartCall(l *admit.Limiter, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), restartDecisionTimeout)
	defer cancel()
	_, err := l.AllowOrdered(ctx, admit.Request{Key: key, Spec: admit.MustSpec(admit.Every(time.Hour), 5)}, nil)
	return err
}

// restartTraffic makes round's traffic before its crash: 20 calls, which
// also find the connections that died with the last restarted server that
// the last round's calls did not use. It returns those calls, which must
// be outcome unknown with EOF or a reset; any other failure ends the test.
func restartTraffic(t *testing.T, srv *testserver.Server, l *admit.Limiter, round int) restartCounts {
	t.Helper()
	got := restartCounts{causes: map[string]int{}}
	var unknownKeys []string
	for i := range trafficCalls {
		key := fmt.Sprintf("restart:{r%d}:traffic%d", round, i)
		err := restartCall(l, key)
		if errors.Is(err, admit.ErrOutcomeUnknown) && isConnectionEnd(causeOf(err)) {
			got.unknown++
			got.causes["unknown: "+causeOf(err)]++
			unknownKeys = append(unknownKeys, key)
		} else if err != nil {
			t.Fatalf("round %d, traffic before the crash: %v", round+1, err)
		}
	}
	got.unknownRan = keysHeld(t, srv, unknownKeys)
	return got
}

// isConnectionEnd reports whether cause is how a connection of a dead
// server fails a call: EOF, or a reset.
func isConnectionEnd(cause string) bool { return cause == "EOF" || cause == "connection reset by peer" }

// afterRestartCalls makes the 8 calls after round's restart, each on a
// new key, and counts them.
func afterRestartCalls(t *testing.T, srv *testserver.Server, l *admit.Limiter, round int) restartCounts {
	t.Helper()
	got := restartCounts{causes: map[string]int{}}
	var decidedKeys, unknownKeys []string
	for i := range afterRestart {
		key := fmt.Sprintf("restart:{r%d}:after%d", round, i)
		err := restartCall(l, key)
		switch {
		case err == nil:
			got.decided++
			decidedKeys = append(decidedKeys, key)
		case errors.Is(err, admit.ErrNotExecuted):
			got.notExecuted++
			got.causes["not executed: "+causeOf(err)]++
		case errors.Is(err, admit.ErrOutcomeUnknown):
			got.unknown++
			got.causes["unknown: "+causeOf(err)]++
			unknownKeys = append(unknownKeys, key)
		default:
			t.Fatalf("round %d, call %d: an error in neither class: %v", round+1, i+1, err)
		}
	}
	got.decidedRan, got.unknownRan = keysHeld(t, srv, decidedKeys), keysHeld(t, srv, unknownKeys)
	return got
}

// keysHeld counts the keys srv holds among keys.
func keysHeld(t *testing.T, srv *testserver.Server, keys []string) int {
	t.Helper()
	check := testserver.NewClient(t, srv)
	n := 0
	for _, key := range keys {
		e, err := check.Do(context.Background(), check.B().Exists().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		n += int(e)
	}
	return n
}

// checkRestartRound requires of a round's calls after the restart: none
// not executed (the server answered before they were sent); at most
// rc.maxFailed outcome unknown, counting those of the next round's
// traffic, each an EOF or a reset, whose key the new server does not hold,
// and, through the proxy, whose command was written to a connection whose
// server side had ended; every other call decided, on the new server.
func checkRestartRound(t *testing.T, rc restartClient, viaProxy bool, round int, got restartCounts) {
	t.Helper()
	failed := got.unknown + got.leftover
	if got.notExecuted != 0 || failed > rc.maxFailed || got.decided+got.unknown != afterRestart {
		t.Errorf("round %d: %v after the restart, and %d more outcome unknown in the next traffic; want %d decided but at most %d outcome unknown in all, none not executed",
			round+1, got, got.leftover, afterRestart, rc.maxFailed)
	}
	for cause := range got.causes {
		if c, ok := strings.CutPrefix(cause, "unknown: "); !ok || !isConnectionEnd(c) {
			t.Errorf("round %d: a call after the restart failed with %q; want only EOF or a reset from a connection of the old server", round+1, cause)
		}
	}
	if got.unknownRan != 0 || got.decidedRan != got.decided {
		t.Errorf("round %d: the new server holds the keys of %d of %d outcome-unknown calls and %d of %d decided ones; want 0 and all",
			round+1, got.unknownRan, failed, got.decidedRan, got.decided)
	}
	if viaProxy && got.dead != failed {
		t.Errorf("round %d: %d script commands written to connections of the dead server, %d calls outcome unknown; want as many",
			round+1, got.dead, failed)
	}
}

// causeOf is the last part of err's message: the transport error.
func causeOf(err error) string {
	msg := err.Error()
	return msg[strings.LastIndex(msg, ": ")+2:]
}

// loadGoroutines is the number of callers of TestCrashRestartUnderLoad,
// each with one call in flight at a time.
const loadGoroutines = 16

// Phases of TestCrashRestartUnderLoad, by when a call started.
const (
	inFlight  = iota // before the kill began: in flight at the kill, or decided before it
	whileDown        // after the kill began, before the restarted server answered
	restarted        // after the restarted server answered on a connection of its own
)

// TestCrashRestartUnderLoad measures what a crash does to calls in
// flight: 4 rounds of kill -9 and restart while 16 goroutines call
// AllowOrdered without pause on the README's client (AlwaysPipelining).
// The calls are counted by class and by when they started. A call in
// flight when the server dies is outcome unknown (the old server may have
// run it), at most one per goroutine among those started before the kill;
// so is one started in the moment before valkey-go reads the end of its
// connection; the others started while the server is down find no server
// and are not executed; and every call started after the restart is
// decided.
func TestCrashRestartUnderLoad(t *testing.T) {
	if os.Getenv("VALKEY_ADDR") != "" {
		t.Skip("kills and restarts its own server; skipped on VALKEY_ADDR")
	}
	srv := testserver.Own(t)
	c, err := valkey.NewClient(restartClients[0].option(srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := admit.New(c)
	spec := admit.MustSpec(admit.MaxLimit, 1_000_000)
	for round := range restartRounds {
		var (
			mu                   sync.Mutex
			phase                = inFlight
			decided, ne, unknown [3]int
			causes               = map[string]int{}
			stop                 = make(chan struct{})
			wg                   sync.WaitGroup
		)
		for g := range loadGoroutines {
			wg.Go(func() {
				// Bounded: the test stops the callers after the restart,
				// and each call has its own deadline.
				for {
					select {
					case <-stop:
						return
					default:
					}
					mu.Lock()
					started := phase
					mu.Unlock()
					ctx, cancel := context.WithTimeout(context.Background(), restartDecisionTimeout)
					_, err := l.AllowOrdered(ctx, admit.Request{Key: fmt.Sprintf("load:{r%dg%d}", round, g), Spec: spec}, nil)
					cancel()
					mu.Lock()
					switch {
					case err == nil:
						decided[started]++
					case errors.Is(err, admit.ErrNotExecuted):
						ne[started]++
					case errors.Is(err, admit.ErrOutcomeUnknown):
						unknown[started]++
						causes[causeOf(err)]++
					default:
						t.Errorf("round %d: an error in neither class: %v", round+1, err)
					}
					mu.Unlock()
					if err != nil {
						time.Sleep(time.Millisecond) // no server: do not spin
					}
				}
			})
		}
		awaitDecided := func(p, n int) {
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				mu.Lock()
				d := decided[p]
				mu.Unlock()
				if d >= n {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("round %d: %d calls decided within 10s, want %d", round+1, d, n)
				}
			}
		}
		awaitDecided(inFlight, 200)
		setPhase := func(p int) {
			mu.Lock()
			phase = p
			mu.Unlock()
		}
		// The phase moves before the kill: a call started after this
		// counts as started while down even if the server answered it.
		setPhase(whileDown)
		if err := srv.Crash(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		setPhase(restarted)
		awaitDecided(restarted, 200)
		close(stop)
		wg.Wait()
		t.Logf("%s, round %d, %d goroutines; started before the kill: decided %d, not executed %d, outcome unknown %d; "+
			"started from the kill to the restart: decided %d, not executed %d, outcome unknown %d; started after the restart: decided %d, not executed %d, outcome unknown %d; unknown by cause %v",
			srv.Version, round+1, loadGoroutines, decided[0], ne[0], unknown[0], decided[1], ne[1], unknown[1], decided[2], ne[2], unknown[2], causes)
		if unknown[inFlight] > loadGoroutines || unknown[restarted] != 0 || ne[restarted] != 0 {
			t.Errorf("round %d: %d calls in flight at the kill outcome unknown, %d started after the restart outcome unknown and %d not executed; "+
				"want at most %d (one a goroutine), 0 and 0", round+1, unknown[inFlight], unknown[restarted], ne[restarted], loadGoroutines)
		}
		for cause := range causes {
			if cause != "EOF" && cause != "connection reset by peer" && cause != "broken pipe" {
				t.Errorf("round %d: a call failed outcome unknown with %q; want only EOF, a reset or a broken pipe from the dying server", round+1, cause)
			}
		}
	}
}
