package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/fleetenv"
)

// PublishCommand is `outgress publish`: it seeds the demo's channels under
// the fleet's prefix and publishes the demo's mix on the fleet's lanes,
// traffic for running workers. It returns the exit code.
func PublishCommand(args []string) int {
	fs := fleetenv.NewFleetCommand("publish")
	rate := fs.Int("rate", 300, "messages a `second`")
	d := fs.Duration("for", 10*time.Second, "how long to publish")
	nchan := fs.Int("channels", 40, "channels in the mix (seeded first)")
	valkeyAddr, natsURL, err := fs.ParseEnv(args, true)
	if err != nil {
		return fs.Fail(2, err)
	}
	ctx, stop := fs.Context()
	defer stop()
	if err := publishFor(ctx, valkeyAddr, natsURL, fs.Fleet, *rate, *d, *nchan); err != nil {
		return fs.Fail(1, err)
	}
	return 0
}

func publishFor(ctx context.Context, valkeyAddr, natsURL string, ff fleetenv.Flags, rate int, d time.Duration, nchan int) error {
	c, err := fleetenv.DialAddr(valkeyAddr)()
	if err != nil {
		return err
	}
	defer c.Close()
	if err := SeedChannels(ctx, c, *ff.Prefix, nchan); err != nil {
		return fmt.Errorf("seeding channels: %w", err)
	}
	busCfg := bus.Config{Stream: *ff.Stream, Subjects: fleetenv.LaneSubjects(*ff.Subjects)}
	pub, err := bus.Connect(ctx, natsURL, "outgress-publisher", busCfg)
	if err != nil {
		return err
	}
	defer pub.Close()
	if err := bus.Setup(ctx, pub.JetStream(), busCfg); err != nil {
		return err
	}
	published, refused := Publish(ctx, pub, busCfg.Subjects, rate, d, nchan, uint64(time.Now().UnixNano()))
	fmt.Printf("published %d messages (%d refused by the stream)\n", published, refused)
	return nil
}
