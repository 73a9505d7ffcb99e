package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/pause"
)

// A timingRule is one relation between the worker's, the bus's and the
// pause's timings that must hold for the delivery contract to mean what the
// README says. Each has a test that breaks it at its boundary and a mutant
// (the rule switched off) that the test catches (TestTimingRules).
type timingRule struct {
	name string
	// broken returns what is wrong, or "" when the rule holds.
	broken func(w Config, b bus.Config, p pause.Config) string
}

var timingRules = []timingRule{
	{"lifetimes", func(w Config, b bus.Config, _ pause.Config) string {
		if w.Lifetime != b.Lifetime {
			return fmt.Sprintf("the worker's message lifetime (%v) differs from the bus's (%v): one side would drop or send what the other still counts live; set both to the same value", w.Lifetime, b.Lifetime)
		}
		return ""
	}},
	{"ack_wait", func(w Config, b bus.Config, _ pause.Config) string {
		if b.AckWait <= w.Lifetime {
			return fmt.Sprintf("the bus AckWait (%v) does not exceed the message lifetime (%v), which bounds a handler's run: a slow handler's message would be redelivered to another replica while it runs, and sent twice; set AckWait above the lifetime (the default is lifetime + 1s)", b.AckWait, w.Lifetime)
		}
		return ""
	}},
	{"paused_retry", func(w Config, _ bus.Config, _ pause.Config) string {
		if w.PausedRetry >= w.Lifetime {
			return fmt.Sprintf("the paused retry delay (%v) is not below the message lifetime (%v): every message met by a pause would be dropped at once instead of waiting it out; lower PausedRetry", w.PausedRetry, w.Lifetime)
		}
		return ""
	}},
	{"max_deliver", func(w Config, b bus.Config, _ pause.Config) string {
		if time.Duration(b.MaxDeliver-1)*w.PausedRetry < w.Lifetime {
			return fmt.Sprintf("MaxDeliver (%d) redeliveries %v apart (the paused retry) end before the message lifetime (%v): a pause shorter than a message's life would drop it as max_attempts; raise MaxDeliver to at least %d or PausedRetry", b.MaxDeliver, w.PausedRetry, w.Lifetime, int((w.Lifetime+w.PausedRetry-1)/w.PausedRetry)+1)
		}
		return ""
	}},
	{"error_delay", func(w Config, b bus.Config, _ pause.Config) string {
		if b.ErrorDelay >= w.Lifetime {
			return fmt.Sprintf("the bus error delay (%v) is not below the message lifetime (%v): a message whose dependency failed once could never be retried; lower ErrorDelay", b.ErrorDelay, w.Lifetime)
		}
		return ""
	}},
	{"decision_retries", func(w Config, _ bus.Config, _ pause.Config) string {
		n := w.DecisionAttempts
		total := w.DecisionBackoff * time.Duration(n*(n+1)/2) // the n-th retry waits n backoffs; one more for an unknown outcome
		if total >= w.Lifetime {
			return fmt.Sprintf("the limiter retries' backoff (%d attempts, %v apart and growing: %v in all) is not below the message lifetime (%v): the retries could not finish within a message's life; lower DecisionBackoff or DecisionAttempts", n, w.DecisionBackoff, total, w.Lifetime)
		}
		return ""
	}},
	{"reconcile", func(_ Config, _ bus.Config, p pause.Config) string {
		longest := p.LongestGap()
		if longest >= p.MaxAge {
			return fmt.Sprintf("the pause reconciler's longest gap (%v: ReconcileEvery %v + 20%% jitter, plus its %v timeout) is not below the pause MaxAge (%v): a healthy replica would fail closed between two reconciles; lower ReconcileEvery or raise MaxAge", longest, p.ReconcileEvery, p.Timeout, p.MaxAge)
		}
		return ""
	}},
	{"kill_grace", func(w Config, _ bus.Config, _ pause.Config) string {
		if need := w.Lifetime + bus.CloseFlush; need > w.KillGrace {
			return fmt.Sprintf("the message lifetime (%v) plus the bus's last flush (%v) does not fit the kill grace period (%v): a replica stopped with a handler running would be killed before its message is settled, and the message sent again by another replica after AckWait; raise KillGrace (and the deployment's grace period) to at least %v", w.Lifetime, bus.CloseFlush, w.KillGrace, need)
		}
		return ""
	}},
}

// ErrTiming is wrapped by CheckTiming's errors.
var ErrTiming = errors.New("outgress: timing configuration refused")

// CheckTiming checks, at start-up, the relations between the worker's
// message lifetime and retries, the bus's AckWait, MaxDeliver and error
// delay, and the pause's MaxAge and reconcile interval (the defaults are
// applied first, as New, bus.Connect and pause.New apply them). It returns
// nil, or an error wrapping ErrTiming that names every broken relation and
// what to change. A replica refuses to start on such a configuration.
func CheckTiming(w Config, b bus.Config, p pause.Config) error {
	return checkTiming(w, b, p, nil)
}

func checkTiming(w Config, b bus.Config, p pause.Config, skip map[string]bool) error {
	w, b, p = w.WithDefaults(), b.WithDefaults(), p.WithDefaults()
	var errs []error
	for _, r := range timingRules {
		if skip[r.name] {
			continue
		}
		if msg := r.broken(w, b, p); msg != "" {
			errs = append(errs, fmt.Errorf("%w: %s: %s", ErrTiming, r.name, msg))
		}
	}
	return errors.Join(errs...)
}
