package limits_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admittest"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/valkey-io/valkey-go"
)

// TestMain stops the shared test servers after the last test.
func TestMain(m *testing.M) { testenv.Main(m) }

// deployment is the addresses the conformance suite runs on: a 3-primary
// cluster of the tests' own with VALKEY_CLUSTER=1, else the shared server.
func deployment(t *testing.T) (addrs []string, name string) {
	if os.Getenv("VALKEY_CLUSTER") == "1" {
		return testenv.Cluster(t), "3-primary cluster, started by the tests"
	}
	return []string{testenv.Shared(t).Addr}, "standalone, started by the tests"
}

// workerClient builds the client a worker replica decides through, as the
// demo does (valkey-go without client-side caching, wrapped by
// counting.Client), on addrs.
func workerClient(t *testing.T, addrs []string) (valkey.Client, valkey.ClientOption) {
	t.Helper()
	opt := valkey.ClientOption{InitAddress: addrs, DisableCache: true}
	raw, err := valkey.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Close)
	return &counting.Client{Client: raw}, opt
}

// adapterPrefix is a worker's Config.Prefix of the test's own: it holds
// no hash tag or glob character, like a production prefix.
func adapterPrefix() string {
	return fmt.Sprintf("outgress-test:%x:", rand.Uint64())
}

// TestAdmitConformance runs admit's conformance suite through the worker's
// client setup, on the test deployment (a 3-primary cluster with
// VALKEY_CLUSTER=1), with every key under the prefix the adapter's buckets
// live under (Config.Prefix + "rl:"): what the suite proves of admit holds
// for the adapter's keys, client and server.
func TestAdmitConformance(t *testing.T) {
	addrs, name := deployment(t)
	client, opt := workerClient(t, addrs)
	t.Logf("deployment: %s", name)
	admittest.Run(t, client, admittest.WithClientOption(opt), admittest.WithPrefix(adapterPrefix()+"rl:"), admittest.Owned())
}

// TestAdapterKeysOnCluster checks the adapter's real keys and Specs on a
// real cluster: a channel's standard and shared keys, and the Helix keys,
// each share one hash slot (CLUSTER KEYSLOT), every plan decides with
// AllowOrderedOnce (the worker's call, whose record lives in the first
// key's slot) without a cross-slot refusal, and the buckets the server
// stores are those of the seed plan: a new bucket holds burst - 1 tokens
// after the call, and its expiry is burst × interval after its ts.
func TestAdapterKeysOnCluster(t *testing.T) {
	client, _ := workerClient(t, testenv.Cluster(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := adapterPrefix()

	slot := func(key string) int64 {
		t.Helper()
		n, err := client.Do(ctx, client.B().ClusterKeyslot().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
		}
		return n
	}
	slots := map[int64]bool{}
	for _, id := range []string{"42", "1001", "7", "123456789"} {
		std, shared := channels.ChatKeys(prefix, id)
		if a, b := slot(std), slot(shared); a != b {
			t.Errorf("channel %s: %s in slot %d, %s in slot %d; want one slot", id, std, a, shared, b)
		} else {
			slots[a] = true
		}
	}
	if len(slots) < 2 {
		t.Errorf("4 channels in %d slot(s): the keys do not spread over the cluster by channel", len(slots))
	}
	helixPlans := limits.HelixPlans(&limits.DefaultLimits, prefix)
	helixSlot := slot(helixPlans[limits.LaneStandard].First.Key)
	for lane, p := range helixPlans {
		for _, k := range []string{p.First.Key, p.Second.Key} {
			if k != "" && slot(k) != helixSlot {
				t.Errorf("Helix lane %v: %s not in the slot of the others (%d)", limits.Lane(lane), k, helixSlot)
			}
		}
	}

	// The seed plan's limits, as burst and burst × interval in ms.
	type bucket struct {
		burst int
		ttlMS int64
	}
	var (
		chatShared      = bucket{20, 30000}
		chatStandard    = bucket{10, 30000}
		chatModShared   = bucket{100, 30000}
		chatModStandard = bucket{75, 30000}
		helixGeneral    = bucket{800, 60000}
		helixStandard   = bucket{480, 60000}
		helixSystem     = bucket{160, 60000}
	)
	lim := admit.New(client)
	n := 0
	check := func(name string, p limits.Plan, want ...bucket) {
		t.Helper()
		var second *admit.Request
		if p.HasSecond {
			second = &p.Second
		}
		n++
		d, err := lim.AllowOrderedOnce(ctx, "keys-"+strconv.Itoa(n), p.First, second)
		if err != nil || !d.Allowed() {
			t.Errorf("%s: %v, %v; want admitted", name, d, err)
			return
		}
		keys := []string{p.First.Key, p.Second.Key}
		for i, w := range want {
			if d.Remaining[i] != w.burst-1 {
				t.Errorf("%s bucket %d: %d tokens left, want %d (burst %d)", name, i+1, d.Remaining[i], w.burst-1, w.burst)
			}
			ts, err := client.Do(ctx, client.B().Hget().Key(keys[i]).Field("ts").Build()).AsInt64()
			if err != nil {
				t.Fatalf("%s: HGET %s ts: %v", name, keys[i], err)
			}
			at, err := client.Do(ctx, client.B().Pexpiretime().Key(keys[i]).Build()).AsInt64()
			if err != nil {
				t.Fatalf("%s: PEXPIRETIME %s: %v", name, keys[i], err)
			}
			if got := at - (ts+999)/1000; got != w.ttlMS {
				t.Errorf("%s bucket %d: expires %d ms after its ts, want %d (burst × interval)", name, i+1, got, w.ttlMS)
			}
		}
		if len(want) == 1 && d.Remaining[1] != -1 {
			t.Errorf("%s: second bucket %d, want -1 (none)", name, d.Remaining[1])
		}
	}
	for i, c := range []struct {
		lane limits.Lane
		mod  bool
		want []bucket
	}{
		{limits.LaneStandard, false, []bucket{chatStandard, chatShared}},
		{limits.LaneStandard, true, []bucket{chatModStandard, chatModShared}},
		{limits.LanePremium, false, []bucket{chatShared}},
		{limits.LanePremium, true, []bucket{chatModShared}},
	} {
		id := strconv.Itoa(500 + i) // a channel of its own: new buckets
		std, shared := channels.ChatKeys(prefix, id)
		ch := &channels.Channel{ID: id, BotIsMod: c.mod, StandardKey: std, SharedKey: shared}
		check(fmt.Sprintf("chat %v mod=%v", c.lane, c.mod), limits.ChatPlan(&limits.DefaultLimits, c.lane, ch), c.want...)
	}
	// The Helix buckets are shared by the lanes: each lane on a prefix of
	// its own, so that each call meets new buckets.
	for lane, want := range [limits.NumLanes][]bucket{
		limits.LaneStandard: {helixStandard, helixGeneral},
		limits.LanePremium:  {helixGeneral},
		limits.LaneSystem:   {helixSystem, helixGeneral},
	} {
		p := limits.HelixPlans(&limits.DefaultLimits, prefix+strconv.Itoa(lane)+":")[lane]
		check(fmt.Sprintf("helix %v", limits.Lane(lane)), p, want...)
	}
}
