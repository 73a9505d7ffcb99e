package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
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
	unknownRan                    int // unknown calls whose key the new server holds
	causes                        map[string]int
	live, dead                    int // script commands that reached a live server connection, and a dead one (proxy only)
}

func (c restartCounts) String() string {
	s := fmt.Sprintf("decided %d, not executed %d, outcome unknown %d", c.decided, c.notExecuted, c.unknown)
	if len(c.causes) > 0 {
		s += fmt.Sprintf(" %v", c.causes)
	}
	return s
}

// restartClient is a client configuration of the crash-and-restart test.
type restartClient struct {
	name   string
	option func(addr string) valkey.ClientOption
}

var restartClients = []restartClient{
	{"README client", func(addr string) valkey.ClientOption {
		return valkey.ClientOption{InitAddress: []string{addr}}
	}},
	{"AlwaysPipelining", func(addr string) valkey.ClientOption {
		return valkey.ClientOption{InitAddress: []string{addr}, AlwaysPipelining: true}
	}},
}

// TestCrashRestart measures what calls sent after a store's kill -9 and
// restart get: 4 rounds of traffic, kill -9, a restart on the same port
// (awaited on a connection of its own), then 8 sequential calls on one
// long-lived Limiter, each with its own new key, so that whether it ran on
// the new server shows in whether its key exists there. Directly, and
// through a proxy that shows whether each failed call's command reached a
// live server connection or was written after its connection's server
// side had ended.
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
				for round := range restartRounds {
					got := crashRestartRound(t, srv, l, proxy, round)
					t.Logf("%s, %s, round %d: %d calls after the restart: %v; on the wire: %d to a live connection, %d to a dead one",
						srv.Version, name, round+1, afterRestart, got, got.live, got.dead)
					total.decided += got.decided
					total.notExecuted += got.notExecuted
					total.unknown += got.unknown
					total.unknownRan += got.unknownRan
					total.live += got.live
					total.dead += got.dead
				}
				t.Logf("%s, %s, total: %d calls after %d restarts: %v; unknown that ran: %d; on the wire: %d live, %d dead",
					srv.Version, name, restartRounds*afterRestart, restartRounds, total, total.unknownRan, total.live, total.dead)
			})
		}
	}
}

// crashRestartRound runs one round: traffic, kill -9, restart, and the
// calls after it, counted.
func crashRestartRound(t *testing.T, srv *testserver.Server, l *admit.Limiter, proxy *countProxy, round int) restartCounts {
	t.Helper()
	spec := admit.MustSpec(admit.Every(time.Hour), 5)
	call := func(key string) error {
		ctx, cancel := context.WithTimeout(context.Background(), restartDecisionTimeout)
		defer cancel()
		_, err := l.AllowOrdered(ctx, admit.Request{Key: key, Spec: spec}, nil)
		return err
	}
	prefix := fmt.Sprintf("restart:{r%d}:", round)
	for i := range 20 {
		if err := call(fmt.Sprintf("%straffic%d", prefix, i%3)); err != nil {
			t.Fatalf("round %d, traffic before the crash: %v", round+1, err)
		}
	}
	if err := srv.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var live0, dead0 int
	if proxy != nil {
		live0, dead0 = proxy.scriptCommands()
	}
	got := restartCounts{causes: map[string]int{}}
	var unknownKeys []string
	for i := range afterRestart {
		key := fmt.Sprintf("%safter%d", prefix, i)
		err := call(key)
		switch {
		case err == nil:
			got.decided++
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
	if proxy != nil {
		live1, dead1 := proxy.scriptCommands()
		got.live, got.dead = live1-live0, dead1-dead0
	}
	check := testserver.NewClient(t, srv)
	for _, key := range unknownKeys {
		n, err := check.Do(context.Background(), check.B().Exists().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		got.unknownRan += int(n)
	}
	return got
}

// causeOf is the last part of err's message: the transport error.
func causeOf(err error) string {
	msg := err.Error()
	return msg[strings.LastIndex(msg, ": ")+2:]
}
