// Package fleetenv is what the processes of one outgress fleet share: the
// flags that say where its keys, subjects and stream are, the servers
// (VALKEY_ADDR and NATS_URL), the lanes' subjects and the workers a
// replica runs on each lane.
package fleetenv

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/valkey-io/valkey-go"
)

// LaneWorkers is the workers per lane in each replica; the Helix
// transport keeps as many idle connections as a replica has workers.
var LaneWorkers = [limits.NumLanes]int{limits.LaneStandard: 6, limits.LanePremium: 3, limits.LaneSystem: 2}

// Workers is a replica's workers on every lane, the most limiter calls it
// can have in flight.
func Workers() int {
	n := 0
	for _, w := range LaneWorkers {
		n += w
	}
	return n
}

// LaneSubjects are the lanes' subjects under prefix, in lane order.
func LaneSubjects(prefix string) []string {
	s := make([]string, limits.NumLanes)
	for lane := range limits.NumLanes {
		s[lane] = prefix + "." + lane.String()
	}
	return s
}

// Flags are the flags every fleet command shares: where the fleet's keys,
// subjects and stream are.
type Flags struct{ Prefix, Subjects, Stream *string }

// AddFlags defines the fleet's flags on fs.
func AddFlags(fs *flag.FlagSet) Flags {
	return Flags{
		Prefix:   fs.String("prefix", "outgress:", "the fleet's Valkey key `prefix`"),
		Subjects: fs.String("subjects", "outgress", "the fleet's NATS subject `prefix` (lanes, pause events, management requests)"),
		Stream:   fs.String("stream", "OUTGRESS", "the fleet's JetStream `stream`"),
	}
}

// Env reads VALKEY_ADDR and NATS_URL, which a fleet's processes share:
// both must be set, or NATS_URL alone when needValkey is false.
func Env(needValkey bool) (valkeyAddr, natsURL string, err error) {
	valkeyAddr, natsURL = os.Getenv("VALKEY_ADDR"), os.Getenv("NATS_URL")
	if natsURL == "" || needValkey && valkeyAddr == "" {
		return "", "", errors.New("set VALKEY_ADDR (host:port of the Valkey every replica shares) and NATS_URL (the NATS server with JetStream)")
	}
	return valkeyAddr, natsURL, nil
}

// Dial returns a dialer of opt's server, which says where in its errors.
func Dial(opt valkey.ClientOption, where string) func() (valkey.Client, error) {
	opt.DisableCache = true
	return func() (valkey.Client, error) {
		c, err := valkey.NewClient(opt)
		if err != nil {
			return nil, fmt.Errorf("connecting to %s: %w", where, err)
		}
		return c, nil
	}
}

// DialAddr returns a dialer of the standalone Valkey at addr.
func DialAddr(addr string) func() (valkey.Client, error) {
	return Dial(valkey.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true}, "Valkey at "+addr)
}
