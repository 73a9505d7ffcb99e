package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/admitkit/admit/examples/outgress/worker"
	"github.com/valkey-io/valkey-go"
)

// ContractCase is one message run with an injected fault.
type ContractCase struct {
	Fault string
	// RetryUnknown is the worker's Config.RetryOutcomeUnknown.
	RetryUnknown bool
	LimiterCalls int
	Admitted     bool
	Err          error
	// Charged is how many tokens the message took from its bucket (the
	// premium lane's shared chat limit).
	Charged int
}

// ErrorContract runs four chat messages through a worker on raw (with the
// replica's pause and Helix client), each on a channel of its own, whose
// script calls fail: the first call refused before it was sent (no
// connection: ErrNotExecuted, so the worker retries); the first call's
// reply lost after the server ran it (ErrOutcomeUnknown: by default, the
// plan's rule, not retried: the error nacks the message); the same with
// Config.RetryOutcomeUnknown (the worker repeats it once under the same id
// and gets the recorded Decision back); and, with it, the replies of both
// calls lost (the error nacks the message). Each runs on its own channel,
// ContractFirst to ContractFirst+3, which SeedChannels seeds.
func ErrorContract(ctx context.Context, raw valkey.Client, p *pause.Pause, hx *helix.Helix, m *metrics.Metrics, prefix string) []ContractCase {
	faults := []struct {
		name  string
		err   error
		lost  bool // sent and run, then the reply lost
		calls int64
		retry bool
	}{
		{"connection refused before sending", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false, 1, false},
		{"reply lost after the script ran", io.ErrUnexpectedEOF, true, 1, false},
		{"reply lost after the script ran", io.ErrUnexpectedEOF, true, 1, true},
		{"reply lost twice", io.ErrUnexpectedEOF, true, 2, true},
	}
	var out []ContractCase
	for i, f := range faults {
		var calls atomic.Int64
		fail := func(cmd valkey.Completed) error {
			if isScript(cmd) && calls.Add(1) <= f.calls {
				return f.err
			}
			return nil
		}
		c := &counting.Client{Client: raw}
		if f.lost {
			c.Lose = fail
		} else {
			c.Fault = fail
		}
		channel := ContractFirst + i
		w := worker.New(admit.New(c, admit.WithObserver(m.ObserveLimiter)), p, channels.New(c, channels.Config{Prefix: prefix}), hx, m, worker.Config{Prefix: prefix, RetryOutcomeUnknown: f.retry})
		_, path, err := w.Prepare(ctx, limits.LanePremium, &bus.Message{Data: ChatBody(channel, "error contract"), Published: time.Now()})
		cc := ContractCase{Fault: f.name, RetryUnknown: f.retry, LimiterCalls: path.LimiterCalls, Admitted: path.Admitted, Err: err, Charged: -1}
		_, shared := channels.ChatKeys(prefix, strconv.Itoa(channel))
		if tokens, err := raw.Do(ctx, raw.B().Hget().Key(shared).Field("tokens").Build()).AsInt64(); err == nil {
			cc.Charged = limits.DefaultLimits.ChatShared.Burst() - int(tokens)
		} else if valkey.IsValkeyNil(err) {
			cc.Charged = 0
		}
		out = append(out, cc)
	}
	return out
}

func isScript(cmd valkey.Completed) bool {
	c := cmd.Commands()
	return len(c) > 0 && (strings.EqualFold(c[0], "EVALSHA") || strings.EqualFold(c[0], "EVAL"))
}

// PauseChange is one SetPaused of ChangePause: when (from the start), to
// what, the replica that executed it, the version written or the error,
// and when each replica started acting on it (-1: not within SeenWithin).
type PauseChange struct {
	At      time.Duration
	Paused  bool
	By      string
	Version int64
	Err     error
	Seen    []time.Duration
}

// SeenWithin bounds how long ChangePause waits for each replica to act on
// a change: the pause's MaxAge (its default), past which a replica that
// missed the event has failed closed, and its reconcile (at most
// pause.Config.LongestGap after the change) has long repaired it.
var SeenWithin = pause.Config{}.WithDefaults().MaxAge

// SetPausedFunc asks the fleet to pause or resume, and returns the version
// written and the replica that executed the request.
type SetPausedFunc func(ctx context.Context, paused bool) (version int64, by string, err error)

// ChangePause pauses or resumes sending with set, and returns once every
// replica acts on the change (or SeenWithin has passed for those that do
// not), with when each one started to: the one that executed it once its
// transaction returned, the others on the event.
func ChangePause(ctx context.Context, start time.Time, paused bool, set SetPausedFunc, replicas ...*pause.Pause) PauseChange {
	// Every replica watches its own snapshot from before the request.
	before := make([]int64, len(replicas))
	for i, r := range replicas {
		s, _ := r.Snapshot()
		before[i] = s.Version
	}
	ev := PauseChange{Paused: paused, Seen: make([]time.Duration, len(replicas))}
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, r := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev.Seen[i] = -1
			for deadline := t0.Add(SeenWithin); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(50 * time.Microsecond) {
				if s, ok := r.Snapshot(); ok && s.Version > before[i] && s.Paused == paused {
					ev.Seen[i] = time.Since(t0)
					return
				}
			}
		}()
	}
	ev.At = t0.Sub(start)
	ev.Version, ev.By, ev.Err = set(ctx, paused)
	wg.Wait()
	return ev
}

// MeasureOldShape sends two chat messages per lane, on channels of their
// own, through the old shape (LegacyPrepare) on c, and counts their
// commands into into: the first finds the channel cache cold, the second
// warm.
func MeasureOldShape(ctx context.Context, c *counting.Client, p *pause.Pause, prefix, helixURL string, into *worker.PathTable) error {
	hx, err := helix.New(helix.Config{BaseURL: helixURL}, metrics.New())
	if err != nil {
		return err
	}
	defer hx.Close()
	old := worker.New(admit.New(c), p, channels.New(c, channels.Config{Prefix: prefix}), hx, metrics.New(), worker.Config{Prefix: prefix})
	for _, m := range []struct {
		lane    limits.Lane
		channel int
	}{{limits.LaneStandard, MeasureStd}, {limits.LanePremium, MeasurePremium}} {
		data := ChatBody(m.channel, "measuring the old shape")
		for range 2 {
			var t counting.Tally
			_, path, err := old.LegacyPrepare(counting.WithTally(ctx, &t), m.lane, &bus.Message{Data: data, Published: time.Now()})
			if err != nil {
				return fmt.Errorf("old shape, %v lane: %w", m.lane, err)
			}
			into.Add(path, t.Commands.Load(), t.RoundTrips.Load())
		}
	}
	return nil
}
