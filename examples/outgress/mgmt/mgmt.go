// Package mgmt is the replicas' management interface on NATS, as the plan
// asks: SetPaused is a queue-grouped request, so exactly one replica
// executes it (its pause write and event then reach every replica), and
// system.status answers from a strong lookup of Valkey (pause.Stored), not
// from the answering replica's hot snapshot, which it reports beside it.
package mgmt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/nats-io/nats.go"
)

// Config names the subjects. Zero fields take the defaults named.
type Config struct {
	// Prefix starts both subjects: <Prefix>.set_paused and
	// <Prefix>.status. Default "outgress.mgmt".
	Prefix string
	// Queue is the queue group every replica serves in. Default
	// "outgress-mgmt".
	Queue string
	// Timeout bounds the work of one request. Default 5s.
	Timeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "outgress.mgmt"
	}
	if c.Queue == "" {
		c.Queue = "outgress-mgmt"
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	return c
}

// SetPausedReply is the answer to a set_paused request.
type SetPausedReply struct {
	Replica string `json:"replica"` // the one that executed it
	Version int64  `json:"version"`
	Error   string `json:"error,omitempty"`
	// Conflict is set when the edit was made against a version Valkey no
	// longer holds (pause.ErrVersionConflict): nothing was written.
	Conflict bool `json:"conflict,omitempty"`
}

// Status is the answer to a status request.
type Status struct {
	Replica string `json:"replica"` // the one that answered
	// Paused and Version are read from Valkey for this request; Until is
	// when a timed pause ends on its own (absent for a pause without an
	// end).
	Paused  bool      `json:"paused"`
	Version int64     `json:"version"`
	Until   time.Time `json:"until,omitzero"`
	// Snapshot is the answering replica's hot snapshot, for comparison.
	Snapshot struct {
		Paused  bool      `json:"paused"`
		Until   time.Time `json:"until,omitzero"`
		Version int64     `json:"version"`
		AgeSec  float64   `json:"age_seconds"`
	} `json:"snapshot"`
	Error string `json:"error,omitempty"`
}

// Server is one replica's side of the management interface: its two
// queue subscriptions and what it did.
type Server struct {
	set, status                *nats.Subscription
	executed, failed, answered atomic.Int64
}

// Stats are a Server's counters.
type Stats struct {
	// SetPaused counts the set_paused requests this replica took from the
	// queue group and executed (each request reaches one replica);
	// SetPausedFailed those of them that failed or were malformed.
	SetPaused, SetPausedFailed int64
	// Status counts the status requests this replica answered.
	Status int64
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	return Stats{SetPaused: s.executed.Load(), SetPausedFailed: s.failed.Load(), Status: s.answered.Load()}
}

// Stop unsubscribes both: the replica leaves the queue group, and the
// others answer.
func (s *Server) Stop() {
	s.set.Unsubscribe()
	s.status.Unsubscribe()
}

// Serve answers both requests for replica on nc, in the queue group, until
// Stop. It returns once the server has registered both subscriptions.
func Serve(nc *nats.Conn, cfg Config, replica string, p *pause.Pause) (*Server, error) {
	cfg = cfg.withDefaults()
	srv := &Server{}
	reply := func(m *nats.Msg, v any) {
		b, _ := json.Marshal(v)
		m.Respond(b)
	}
	var err error
	srv.set, err = nc.QueueSubscribe(cfg.Prefix+".set_paused", cfg.Queue, func(m *nats.Msg) {
		srv.executed.Add(1)
		r := SetPausedReply{Replica: replica}
		flag, rest, _ := strings.Cut(string(m.Data), ":")
		against, ms, timed := strings.Cut(rest, ":")
		expected, perr := strconv.ParseInt(against, 10, 64)
		d, derr := strconv.ParseInt(ms, 10, 64)
		switch {
		case (flag == "1" || flag == "0") && perr == nil && expected >= 0 && (!timed || flag == "1" && derr == nil && d > 0):
			ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
			var v int64
			var err error
			if timed {
				v, err = p.PauseFor(ctx, time.Duration(d)*time.Millisecond, expected)
			} else {
				v, err = p.SetPaused(ctx, flag == "1", expected)
			}
			cancel()
			r.Version = v
			if err != nil {
				r.Error = err.Error()
				r.Conflict = errors.Is(err, pause.ErrVersionConflict)
			}
		default:
			r.Error = fmt.Sprintf("set_paused wants \"1:N\" (pause) or \"0:N\" (resume), N the version the edit was made against, "+
				"or \"1:N:D\" (pause for D ms, D at least 1), got %q", m.Data)
		}
		if r.Error != "" {
			srv.failed.Add(1)
		}
		reply(m, r)
	})
	if err != nil {
		return nil, fmt.Errorf("outgress: serving set_paused: %w", err)
	}
	srv.status, err = nc.QueueSubscribe(cfg.Prefix+".status", cfg.Queue, func(m *nats.Msg) {
		srv.answered.Add(1)
		s := Status{Replica: replica}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
		st, err := p.StoredState(ctx)
		cancel()
		if err != nil {
			s.Error = err.Error()
		}
		s.Paused, s.Version, s.Until = st.Paused, st.Version, st.Until
		if snap, ok := p.Snapshot(); ok {
			s.Snapshot.Paused, s.Snapshot.Version, s.Snapshot.Until = snap.Paused, snap.Version, snap.Until
		}
		s.Snapshot.AgeSec = p.Age().Seconds()
		reply(m, s)
	})
	if err != nil {
		srv.set.Unsubscribe()
		return nil, fmt.Errorf("outgress: serving status: %w", err)
	}
	if err := nc.Flush(); err != nil { // the subscriptions are registered
		srv.Stop()
		return nil, fmt.Errorf("outgress: serving management requests: %w", err)
	}
	return srv, nil
}

// SetPaused asks the fleet to pause (or resume), an edit made against
// version expected (a status request's Version): one replica executes it.
// If Valkey holds another version, nothing is written and the error wraps
// pause.ErrVersionConflict, naming both.
func SetPaused(ctx context.Context, nc *nats.Conn, cfg Config, paused bool, expected int64) (SetPausedReply, error) {
	data := "0:" + strconv.FormatInt(expected, 10)
	if paused {
		data = "1:" + strconv.FormatInt(expected, 10)
	}
	return setPaused(ctx, nc, cfg, []byte(data))
}

// PauseFor asks the fleet to pause for d (at least a millisecond), an edit
// made against version expected: the pause ends on its own (see
// pause.Pause.PauseFor).
func PauseFor(ctx context.Context, nc *nats.Conn, cfg Config, d time.Duration, expected int64) (SetPausedReply, error) {
	return setPaused(ctx, nc, cfg, []byte("1:"+strconv.FormatInt(expected, 10)+":"+strconv.FormatInt(max(d.Milliseconds(), 1), 10)))
}

func setPaused(ctx context.Context, nc *nats.Conn, cfg Config, data []byte) (SetPausedReply, error) {
	cfg = cfg.withDefaults()
	var r SetPausedReply
	if err := request(ctx, nc, cfg.Prefix+".set_paused", data, &r); err != nil {
		return r, err
	}
	if r.Conflict {
		return r, fmt.Errorf("%w (set_paused on replica %s): %s", pause.ErrVersionConflict, r.Replica, r.Error)
	}
	if r.Error != "" {
		return r, errors.New("outgress: set_paused on replica " + r.Replica + ": " + r.Error)
	}
	return r, nil
}

// SystemStatus asks the fleet for the pause state, as Valkey holds it.
func SystemStatus(ctx context.Context, nc *nats.Conn, cfg Config) (Status, error) {
	cfg = cfg.withDefaults()
	var s Status
	if err := request(ctx, nc, cfg.Prefix+".status", nil, &s); err != nil {
		return s, err
	}
	if s.Error != "" {
		return s, errors.New("outgress: status on replica " + s.Replica + ": " + s.Error)
	}
	return s, nil
}

func request(ctx context.Context, nc *nats.Conn, subject string, data []byte, into any) error {
	m, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		return fmt.Errorf("outgress: %s: %w", subject, err)
	}
	if err := json.Unmarshal(m.Data, into); err != nil {
		return fmt.Errorf("outgress: %s: reply %q: %w", subject, m.Data, err)
	}
	return nil
}
