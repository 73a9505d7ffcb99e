package worker

import (
	"context"
	"errors"
	"fmt"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/limits"
	"net/http"

	"github.com/valkey-io/valkey-go"
)

// LegacyPrepare is the pre-HTTP path in the shape the plan replaces, kept
// only to measure against (the demo's "old shape" column and the benchmark's
// baseline): a GET of the pause flag on every message (on c), the same channel
// cache, and for a two-bucket decision two scripts in sequence, the second
// sent only when the first admitted. Warm, that is 3 round trips on the
// standard lane and 2 on the premium lane.
func (w *Worker) LegacyPrepare(ctx context.Context, c valkey.Client, lane limits.Lane, m *bus.Message) (*http.Request, Path, error) {
	path := Path{Lane: lane}
	deadline := m.Published.Add(w.cfg.Lifetime)
	cmd, err := command.Decode(m.Data)
	if err != nil {
		return nil, path, &bus.Dropped{Reason: bus.DropMalformed, Err: err}
	}
	path.Decoded, path.Kind = true, cmd.Kind

	flag, err := c.Do(ctx, c.B().Get().Key(w.pause.FlagKey()).Build()).ToString()
	switch {
	case err == nil && flag == "1":
		path.Paused = true
		return nil, path, bus.RetryOrDrop(bus.NackPaused, w.cfg.PausedRetry, deadline.Sub(w.cfg.Now()))
	case err != nil && !valkey.IsValkeyNil(err):
		return nil, path, fmt.Errorf("outgress: pause lookup: %w", err)
	}

	var ch *channels.Channel
	if cmd.Kind.NeedsChannel() {
		ch, path.Cache, err = w.channels.Get(ctx, cmd.Channel)
		if errors.Is(err, channels.ErrUnknown) {
			return nil, path, &bus.Dropped{Reason: bus.DropUnknownChannel}
		}
		if err != nil {
			return nil, path, err
		}
	}

	p := w.plan(lane, cmd.Kind, ch)
	d, err := w.lim.AllowOrdered(ctx, p.First, nil)
	if err == nil && d.Allowed() && p.HasSecond {
		d, err = w.lim.AllowOrdered(ctx, p.Second, nil)
		if !d.Allowed() {
			d.Denied = 2
		}
	}
	if err != nil {
		return nil, path, fmt.Errorf("outgress: limiter: %w", err)
	}
	path.Decided, path.Admitted = true, d.Allowed()
	if !d.Allowed() {
		return nil, path, bus.RetryOrDrop(bus.NackLimited, d.RetryAfter, deadline.Sub(w.cfg.Now()))
	}
	req, err := w.helix.NewRequest(ctx, &cmd, ch)
	if err != nil {
		return nil, path, &bus.Dropped{Reason: bus.DropMalformed, Err: err}
	}
	return req, path, nil
}
