// Package demo is the outgress demo's surroundings: the servers it runs
// on (VALKEY_ADDR, else an in-process miniredis; NATS_URL, else an
// embedded nats-server with JetStream), the channels it seeds, the keys it
// deletes after, and the traffic it publishes: a fixed mix of standard and
// premium chat and Helix calls, with a few messages meant to be refused.
package demo

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// The channels of the demo.
const (
	FirstChannel   = 1001 // the mix uses 1001 .. 1000+channels; the first three are hot
	MeasureStd     = 2001 // channels outside the mix, for one-off measurements
	MeasurePremium = 2002
	ContractFirst  = 2011 // 2011 .. 2014: one channel per case of ErrorContract (none a moderator's)
	UnknownChannel = 9999 // never seeded: its messages are dropped
)

// Publish publishes rate messages a second for d, in 10 ms ticks, on the
// lanes' subjects (in lane order), drawn from NewMix(seed, channels): the
// traffic of `go run . publish`. The demo and the rollout publish by count
// instead (PublishMix), so that a slow machine publishes the same messages,
// only more slowly.
func Publish(ctx context.Context, pub *bus.Bus, subjects []string, rate int, d time.Duration, channels int, seed uint64) (published, refused int) {
	mix := NewMix(seed, channels)
	end := time.Now().Add(d)
	return publish(ctx, pub, subjects, mix, rate, func(int) bool { return time.Now().Before(end) }, nil)
}

// PublishMix publishes the next n messages of mix on the lanes' subjects
// (in lane order), at most rate a second (in 10 ms ticks), and returns how
// many the stream stored and how many it refused: n in all, unless ctx
// ends first. room, if set, holds publishing back while it reports false
// (checked before each message), for at most MaxHold at a time: a fleet
// that falls behind is not buried under messages that would wait out their
// lifetime in the stream.
func PublishMix(ctx context.Context, pub *bus.Bus, subjects []string, mix *Mix, n, rate int, room func() bool) (published, refused int) {
	return publish(ctx, pub, subjects, mix, rate, func(sent int) bool { return sent < n }, room)
}

// MaxHold bounds how long PublishMix holds a message back for room.
const MaxHold = 10 * time.Second

// publish publishes mix's messages, up to rate a second, while more(sent)
// reports true; sent counts those published and refused. A message waits
// for a tick with room (room nil: always), MaxHold at most.
func publish(ctx context.Context, pub *bus.Bus, subjects []string, mix *Mix, rate int, more func(sent int) bool, room func() bool) (published, refused int) {
	perTick := max(rate/100, 1)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var held time.Time // since when the next message has waited for room
	for first := true; more(published + refused); first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		for range perTick {
			if !more(published+refused) || ctx.Err() != nil {
				break
			}
			if room != nil && !room() {
				if held.IsZero() {
					held = time.Now()
				}
				if time.Since(held) < MaxHold {
					break
				}
			}
			held = time.Time{}
			lane, data := mix.Next()
			if _, err := pub.Publish(ctx, subjects[lane], data); err != nil {
				refused++
				continue
			}
			published++
		}
	}
	return
}

// A Mix is the demo's traffic as a fixed sequence, the same for the same
// seed: one malformed message and one for an unknown channel first, so
// that every run shows both drops however few it publishes, then draws of
// Message on channels channels. The mix: 60% standard chat, 15% premium
// chat, 10% Helix API calls (any lane), 8% announcements, 7% shoutouts;
// 30% of chat goes to three hot channels, enough to exhaust their standard
// share. A few messages are malformed, name an unknown channel, or shout a
// channel out to itself (which Helix refuses). A Mix is not safe for
// concurrent use.
type Mix struct {
	rng      *rand.Rand
	channels int
	drawn    int
}

// NewMix returns the mix of seed on channels channels.
func NewMix(seed uint64, channels int) *Mix {
	return &Mix{rng: rand.New(rand.NewPCG(seed, 2)), channels: channels}
}

// Next returns the next message of the mix: its lane and body.
func (m *Mix) Next() (limits.Lane, []byte) {
	m.drawn++
	switch m.drawn {
	case 1:
		return limits.LaneStandard, malformedChat
	case 2:
		return limits.LaneStandard, ChatBody(UnknownChannel, "hello?")
	}
	return Message(m.rng, m.channels)
}

// Message draws one message of the mix: its lane and body.
func Message(rng *rand.Rand, channels int) (limits.Lane, []byte) {
	channel := func() int {
		if rng.IntN(10) < 3 {
			return FirstChannel + rng.IntN(3)
		}
		return FirstChannel + rng.IntN(channels)
	}
	helixLane := []limits.Lane{limits.LaneStandard, limits.LaneStandard, limits.LanePremium, limits.LaneSystem}[rng.IntN(4)]
	switch r := rng.IntN(1000); {
	case r < 5:
		return limits.LaneStandard, malformedChat
	case r < 10:
		return limits.LaneStandard, ChatBody(UnknownChannel, "hello?")
	case r < 600:
		return limits.LaneStandard, ChatBody(channel(), "hello from the standard lane")
	case r < 750:
		return limits.LanePremium, ChatBody(channel(), "hello from the premium lane")
	case r < 850:
		return helixLane, mustJSON(map[string]string{"kind": "api", "method": "GET", "path": "/helix/users?id=" + strconv.Itoa(channel())})
	case r < 930:
		return helixLane, mustJSON(map[string]string{"kind": "announce", "channel": strconv.Itoa(channel()), "text": "stream starts soon", "color": "blue"})
	default:
		from, to := channel(), channel()
		if rng.IntN(10) == 0 {
			to = from
		}
		return helixLane, mustJSON(map[string]string{"kind": "shoutout", "channel": strconv.Itoa(from), "to": strconv.Itoa(to)})
	}
}

// malformedChat names a channel that would break a hash tag.
var malformedChat = []byte(`{"kind":"chat","channel":"12}x","text":"hi"}`)

// ChatBody is a chat command body.
func ChatBody(channel int, text string) []byte {
	return mustJSON(map[string]string{"kind": "chat", "channel": strconv.Itoa(channel), "text": text})
}

// mustJSON encodes a map of strings, which cannot fail.
func mustJSON(v map[string]string) []byte {
	b, _ := json.Marshal(v)
	return b
}

// SeedChannels stores the metadata of the mix's channels, the two
// measurement channels and the error contract's three. Every fifth channel
// has the bot as a moderator.
func SeedChannels(ctx context.Context, c valkey.Client, prefix string, n int) error {
	var cmds valkey.Commands
	for _, id := range seeded(n) {
		mod := "0"
		if id%5 == 0 {
			mod = "1"
		}
		cmds = append(cmds, c.B().Hset().Key(channels.Key(prefix, strconv.Itoa(id))).FieldValue().
			FieldValue("login", "channel"+strconv.Itoa(id)).FieldValue("bot_mod", mod).Build())
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// seeded is the ids of the channels SeedChannels stores for a mix on n
// channels.
func seeded(n int) []int {
	ids := []int{MeasureStd, MeasurePremium, ContractFirst, ContractFirst + 1, ContractFirst + 2, ContractFirst + 3}
	for id := FirstChannel; id < FirstChannel+n; id++ {
		ids = append(ids, id)
	}
	return ids
}

// NATS returns NATS_URL, or the URL of an embedded nats-server with
// JetStream that it starts.
func NATS() (url, where string, stop func(), err error) {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u, "NATS at " + u, func() {}, nil
	}
	e, err := bus.StartEmbedded()
	if err != nil {
		return "", "", nil, err
	}
	return e.URL(), "embedded nats-server with JetStream at " + e.URL() + " (set NATS_URL to use another)", e.Close, nil
}

// Valkey returns a dialer for VALKEY_ADDR, or for an in-process
// miniredis it starts.
func Valkey() (dial func() (valkey.Client, error), where string, stop func(), err error) {
	if addr := os.Getenv("VALKEY_ADDR"); addr != "" {
		where = "Valkey at " + addr
		return fleetenv.Dial(valkey.ClientOption{InitAddress: []string{addr}}, where), where, func() {}, nil
	}
	srv, err := miniredis.Run()
	if err != nil {
		return nil, "", nil, err
	}
	// miniredis answers CLUSTER SLOTS; without ForceSingleClient valkey-go
	// would treat it as a cluster.
	where = "in-process miniredis (set VALKEY_ADDR=host:port to use a real Valkey)"
	return fleetenv.Dial(valkey.ClientOption{InitAddress: []string{srv.Addr()}, ForceSingleClient: true}, where), where, srv.Close, nil
}

// Forget deletes the keys that SeedChannels(prefix, n) and a pause state
// under prefix wrote, within 10 s: the keys of a demo run that do not
// expire on their own (buckets and decision records do).
func Forget(c valkey.Client, prefix string, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys := pause.Keys(prefix)
	for _, id := range seeded(n) {
		keys = append(keys, channels.Key(prefix, strconv.Itoa(id)))
	}
	for _, k := range keys { // one key per DEL: keys of many slots, on a cluster too
		c.Do(ctx, c.B().Del().Key(k).Build())
	}
}
