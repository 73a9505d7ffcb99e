package mgmt

import (
	"context"
	"fmt"
	"time"

	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/nats-io/nats.go"
)

// Command is `outgress mgmt pause|resume|status`: one management request
// to the fleet, answered by one replica. It returns the exit code: 1 when
// the request fails, 2 on bad usage.
func Command(args []string) int {
	fs := fleetenv.NewFleetCommand("mgmt")
	against := fs.Int64("version", -1, "pause|resume: the `version` the edit is made against (a status request's); "+
		"refused, writing nothing, if the fleet has moved past it. Default: the version a status request reads just before")
	pauseFor := fs.Duration("for", 0, "pause: end the pause on its own after this `duration` (0: no end)")
	_, natsURL, err := fs.ParseEnv(args, false)
	if err != nil || fs.NArg() != 1 {
		return fs.Usage("NATS_URL=... outgress mgmt [-subjects outgress] [-version N] [-for 10m] pause|resume|status")
	}
	nc, err := nats.Connect(natsURL, nats.Name("outgress-mgmt"))
	if err != nil {
		return fs.Fail(1, err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := Config{Prefix: *fs.Fleet.Subjects + ".mgmt"}
	switch cmd := fs.Arg(0); cmd {
	case "pause", "resume":
		expected := *against
		if expected < 0 {
			s, err := SystemStatus(ctx, nc, cfg)
			if err != nil {
				return fs.Fail(1, err)
			}
			expected = s.Version
		}
		var r SetPausedReply
		var err error
		if cmd == "pause" && *pauseFor > 0 {
			r, err = PauseFor(ctx, nc, cfg, *pauseFor, expected)
		} else {
			r, err = SetPaused(ctx, nc, cfg, cmd == "pause", expected)
		}
		if err != nil {
			return fs.Fail(1, err)
		}
		fmt.Printf("%sd by replica %s: version %d (the edit was made against version %d)\n", cmd, r.Replica, r.Version, expected)
	case "status":
		s, err := SystemStatus(ctx, nc, cfg)
		if err != nil {
			return fs.Fail(1, err)
		}
		until := ""
		if !s.Until.IsZero() {
			until = " until " + s.Until.Format(time.RFC3339)
		}
		fmt.Printf("Valkey: paused %v%s, version %d (read for this request by replica %s); its snapshot: paused %v, version %d, %.1f s old\n",
			s.Paused, until, s.Version, s.Replica, s.Snapshot.Paused, s.Snapshot.Version, s.Snapshot.AgeSec)
	default:
		return fs.Fail(2, fmt.Errorf("unknown request %q; want pause, resume or status", cmd))
	}
	return 0
}
