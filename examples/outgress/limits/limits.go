// Package limits holds the outgress worker's rate limits: the admit Specs
// of Twitch's chat and Helix budgets and the share of each that the
// standard and system lanes may use, the lanes and bucket classes (fixed
// metric labels), and the Plans, the one limiter call of each message.
package limits

import (
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/internal/label"
)

// The third party's limits, and the share of each that the standard lane may
// use. Premium traffic uses the shared bucket alone, so whatever the
// standard share leaves is reserved for it.
//
// Chat (per channel): 20 messages per 30 s for a sender that is not a
// moderator, 100 per 30 s for a moderator. The premium reserve is sized for
// premium's peak (about 10 to 25 messages per 30 s in a channel), not as a
// fixed fraction, because every reserved token is one that standard traffic
// cannot use even while premium is idle:
//
//	sender          shared (whole limit)   standard share    premium reserve
//	not moderator   20 / 30 s              10 / 30 s (50%)   10 / 30 s
//	moderator       100 / 30 s             75 / 30 s (75%)   25 / 30 s
//
// Helix (per application token): 800 points per minute, one point a call.
// The standard lane may use 60% and the system lane (calls the platform makes
// on its own behalf) 20%; premium keeps at least the last 20%:
//
//	general (whole limit)   800 / min
//	standard share          480 / min
//	system share            160 / min
var (
	chatShared      = admit.MustSpec(admit.Every(1500*time.Millisecond), 20)
	chatStandard    = admit.MustSpec(admit.Every(3*time.Second), 10)
	chatModShared   = admit.MustSpec(admit.Every(300*time.Millisecond), 100)
	chatModStandard = admit.MustSpec(admit.Every(400*time.Millisecond), 75)
	helixGeneral    = admit.MustSpec(admit.Every(75*time.Millisecond), 800)
	helixStandard   = admit.MustSpec(admit.Every(125*time.Millisecond), 480)
	helixSystem     = admit.MustSpec(admit.Every(375*time.Millisecond), 160)
)

// Limits is the set of Specs a Worker decides with. DefaultLimits holds the
// production values above; tests and benchmarks substitute their own.
type Limits struct {
	ChatShared, ChatStandard       admit.Spec // the bot is not a moderator
	ChatModShared, ChatModStandard admit.Spec // the bot is a moderator
	HelixGeneral                   admit.Spec // the whole Helix budget
	HelixStandard, HelixSystem     admit.Spec // the standard and system lanes' shares
}

// DefaultLimits are the Specs documented at the top of this file.
var DefaultLimits = Limits{
	ChatShared: chatShared, ChatStandard: chatStandard,
	ChatModShared: chatModShared, ChatModStandard: chatModStandard,
	HelixGeneral: helixGeneral, HelixStandard: helixStandard, HelixSystem: helixSystem,
}

// Lane is the bus subject a command arrived on; it decides which buckets
// the command is charged to.
type Lane uint8

// The lanes. System is for Helix calls the platform makes itself; chat is
// never sent on it.
const (
	LaneStandard Lane = iota
	LanePremium
	LaneSystem
	NumLanes
)

var laneNames = [NumLanes]string{"standard", "premium", "system"}

// String is the lane's metric label.
func (l Lane) String() string { return label.Of(laneNames[:], l) }

// BucketClass is a bucket's role. It is the fixed metric label for a
// denial: never the key, which names a channel.
type BucketClass uint8

// The bucket classes.
const (
	ClassStandard BucketClass = iota // a standard lane's share (chat or Helix)
	ClassShared                      // a channel's whole chat limit
	ClassGeneral                     // the whole Helix budget
	ClassSystem                      // the system lane's Helix share
	NumClasses
)

var classNames = [NumClasses]string{"standard", "shared", "general", "system"}

// String is the class's metric label.
func (c BucketClass) String() string { return label.Of(classNames[:], c) }

// Plan is one limiter call (the worker makes it with AllowOrderedOnce):
// First, then Second when HasSecond; the classes name the buckets for
// metrics.
type Plan struct {
	First, Second           admit.Request
	HasSecond               bool
	FirstClass, SecondClass BucketClass
}

// DeniedClass names the bucket that refused d.
func (p *Plan) DeniedClass(d admit.Decision) BucketClass {
	if d.Denied == 2 {
		return p.SecondClass
	}
	return p.FirstClass
}

// ChatPlan is the decision for a chat message in ch on lane: standard
// checks its share and then the channel's limit; premium the limit alone.
func ChatPlan(l *Limits, lane Lane, ch *channels.Channel) Plan {
	shared, standard := l.ChatShared, l.ChatStandard
	if ch.BotIsMod {
		shared, standard = l.ChatModShared, l.ChatModStandard
	}
	sharedReq := admit.Request{Key: ch.SharedKey, Spec: shared}
	if lane == LanePremium {
		return Plan{First: sharedReq, FirstClass: ClassShared}
	}
	return Plan{
		First:  admit.Request{Key: ch.StandardKey, Spec: standard},
		Second: sharedReq, HasSecond: true,
		FirstClass: ClassStandard, SecondClass: ClassShared,
	}
}

// HelixPlans precomputes the Helix decision of every lane. All three Helix
// routes (API call, announcement, shoutout) are charged through these, so
// they cannot drift apart.
func HelixPlans(l *Limits, prefix string) [NumLanes]Plan {
	general := admit.Request{Key: prefix + "rl:{helix}:general", Spec: l.HelixGeneral}
	share := func(name string, s admit.Spec, class BucketClass) Plan {
		return Plan{
			First:  admit.Request{Key: prefix + "rl:{helix}:" + name, Spec: s},
			Second: general, HasSecond: true,
			FirstClass: class, SecondClass: ClassGeneral,
		}
	}
	var p [NumLanes]Plan
	p[LaneStandard] = share("standard", l.HelixStandard, ClassStandard)
	p[LanePremium] = Plan{First: general, FirstClass: ClassGeneral}
	p[LaneSystem] = share("system", l.HelixSystem, ClassSystem)
	return p
}
