package mgmt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/nats-io/nats.go"
)

// Command is `outgress mgmt pause|resume|status`: one management request
// to the fleet, answered by one replica. It returns the exit code: 1 when
// the request fails (a conflict included), 2 on bad usage, and 2 for a
// pause or resume without -version, after printing the state to make the
// edit against.
func Command(args []string) int { return run(args, os.Stdout, os.Stderr) }

// run is Command writing to stdout and stderr.
func run(args []string, stdout, stderr io.Writer) int {
	fs := fleetenv.NewFleetCommand("mgmt")
	fs.SetOutput(stdout, stderr)
	against := fs.Int64("version", -1, "pause|resume: the `version` the edit is made against, the one the operator saw (mgmt status); "+
		"required; refused, writing nothing, if the fleet has moved past it")
	pauseFor := fs.Duration("for", 0, fmt.Sprintf("pause: end the pause on its own after this `duration` (0: no end; at most %v)", pause.MaxPauseFor))
	_, natsURL, err := fs.ParseEnv(args, false)
	if err != nil || fs.NArg() != 1 {
		if err != nil {
			fmt.Fprintf(stderr, "outgress mgmt: %v\n", err)
		}
		return fs.Usage("NATS_URL=... outgress mgmt [-subjects outgress] -version N [-for 10m] pause|resume, or mgmt status")
	}
	cmd := fs.Arg(0)
	switch {
	case cmd != "pause" && cmd != "resume" && cmd != "status":
		return fs.Fail(2, fmt.Errorf("unknown request %q; want pause, resume or status", cmd))
	case *pauseFor != 0 && cmd != "pause":
		return fs.Fail(2, fmt.Errorf("-for applies to pause only (%s given)", cmd))
	case *pauseFor != 0:
		if err := pause.CheckPauseFor(*pauseFor); err != nil {
			return fs.Fail(2, fmt.Errorf("-for %v: %w", *pauseFor, err))
		}
	}
	nc, err := nats.Connect(natsURL, nats.Name("outgress-mgmt"))
	if err != nil {
		return fs.Fail(1, err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := Config{Prefix: *fs.Fleet.Subjects + ".mgmt"}
	if cmd == "status" {
		s, err := SystemStatus(ctx, nc, cfg)
		if err != nil {
			return fs.Fail(1, err)
		}
		fmt.Fprintln(stdout, describe(s))
		return 0
	}
	expected := *against
	if expected < 0 {
		// An edit made against a version read just now would overwrite
		// whatever another operator did since this one last looked: show
		// the state and ask for the version the edit is meant for.
		s, err := SystemStatus(ctx, nc, cfg)
		if err != nil {
			return fs.Fail(1, err)
		}
		fmt.Fprintln(stdout, describe(s))
		forFlag := ""
		if *pauseFor != 0 {
			forFlag = " -for " + pauseFor.String()
		}
		return fs.Fail(2, fmt.Errorf("%s needs -version, the version the edit is made against: if the state above is the one to %s, "+
			"run: outgress mgmt -version %d%s %s", cmd, cmd, s.Version, forFlag, cmd))
	}
	var r SetPausedReply
	if *pauseFor > 0 {
		r, err = PauseFor(ctx, nc, cfg, *pauseFor, expected)
	} else {
		r, err = SetPaused(ctx, nc, cfg, cmd == "pause", expected)
	}
	if err != nil {
		if errors.Is(err, pause.ErrVersionConflict) {
			err = fmt.Errorf("%w; nothing written (mgmt status shows the state now)", err)
		}
		return fs.Fail(1, err)
	}
	fmt.Fprintf(stdout, "%sd by replica %s: version %d (the edit was made against version %d)\n", cmd, r.Replica, r.Version, expected)
	return 0
}

// describe is a status reply as the operator reads it.
func describe(s Status) string {
	until := ""
	if !s.Until.IsZero() {
		until = " until " + s.Until.Format(time.RFC3339)
	}
	return fmt.Sprintf("Valkey: paused %v%s, version %d (read for this request by replica %s); its snapshot: paused %v, version %d, %.1f s old",
		s.Paused, until, s.Version, s.Replica, s.Snapshot.Paused, s.Snapshot.Version, s.Snapshot.AgeSec)
}
