package main

import (
	"time"

	"github.com/admitkit/admit"
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
	numLanes
)

var laneNames = [numLanes]string{"standard", "premium", "system"}

func (l Lane) String() string {
	if l < numLanes {
		return laneNames[l]
	}
	return "invalid"
}

// BucketClass is a bucket's role. It is the fixed metric label for a
// denial: never the key, which names a channel.
type BucketClass uint8

// The bucket classes.
const (
	ClassStandard BucketClass = iota // a standard lane's share (chat or Helix)
	ClassShared                      // a channel's whole chat limit
	ClassGeneral                     // the whole Helix budget
	ClassSystem                      // the system lane's Helix share
	numClasses
)

var classNames = [numClasses]string{"standard", "shared", "general", "system"}

func (c BucketClass) String() string {
	if c < numClasses {
		return classNames[c]
	}
	return "invalid"
}

// bucketPlan is one AllowOrdered call: first, then second when hasSecond.
type bucketPlan struct {
	first, second           admit.Request
	hasSecond               bool
	firstClass, secondClass BucketClass
}

// deniedClass names the bucket that refused d.
func (p *bucketPlan) deniedClass(d admit.Decision) BucketClass {
	if d.Denied == 2 {
		return p.secondClass
	}
	return p.firstClass
}

// chatKeys returns a channel's two chat bucket keys. The hash tag
// {chan:<id>} puts both in one cluster slot, so one script can decide both.
// They are built once per channel, when the channel cache loads it. The keys
// do not depend on the moderator flag: a change of status changes the Spec
// applied to the same budget, so it neither resets nor duplicates it.
func chatKeys(prefix, channelID string) (standard, shared string) {
	base := prefix + "rl:{chan:" + channelID + "}:chat:"
	return base + "standard", base + "shared"
}

// chatPlan is the decision for a chat message in ch on lane: standard
// checks its share and then the channel's limit; premium the limit alone.
func chatPlan(l *Limits, lane Lane, ch *Channel) bucketPlan {
	shared, standard := l.ChatShared, l.ChatStandard
	if ch.BotIsMod {
		shared, standard = l.ChatModShared, l.ChatModStandard
	}
	sharedReq := admit.Request{Key: ch.sharedKey, Spec: shared}
	if lane == LanePremium {
		return bucketPlan{first: sharedReq, firstClass: ClassShared}
	}
	return bucketPlan{
		first:  admit.Request{Key: ch.standardKey, Spec: standard},
		second: sharedReq, hasSecond: true,
		firstClass: ClassStandard, secondClass: ClassShared,
	}
}

// helixPlans precomputes the Helix decision of every lane. All three Helix
// routes (API call, announcement, shoutout) are charged through these, so
// they cannot drift apart.
func helixPlans(l *Limits, prefix string) [numLanes]bucketPlan {
	general := admit.Request{Key: prefix + "rl:{helix}:general", Spec: l.HelixGeneral}
	share := func(name string, s admit.Spec, class BucketClass) bucketPlan {
		return bucketPlan{
			first:  admit.Request{Key: prefix + "rl:{helix}:" + name, Spec: s},
			second: general, hasSecond: true,
			firstClass: class, secondClass: ClassGeneral,
		}
	}
	var p [numLanes]bucketPlan
	p[LaneStandard] = share("standard", l.HelixStandard, ClassStandard)
	p[LanePremium] = bucketPlan{first: general, firstClass: ClassGeneral}
	p[LaneSystem] = share("system", l.HelixSystem, ClassSystem)
	return p
}
