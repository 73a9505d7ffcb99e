package demo

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// TestMixIsFixed draws 5,000 messages twice from one seed: the same
// sequence, chat never on the system lane, and every body decodes except
// the few meant to be malformed (about 0.5%).
func TestMixIsFixed(t *testing.T) {
	draw := func() (lanes []limits.Lane, bodies []string) {
		rng := rand.New(rand.NewPCG(7, 2))
		for range 5000 {
			l, b := Message(rng, 40)
			lanes, bodies = append(lanes, l), append(bodies, string(b))
		}
		return
	}
	l1, b1 := draw()
	l2, b2 := draw()
	if !slices.Equal(l1, l2) || !slices.Equal(b1, b2) {
		t.Fatal("one seed gave two sequences")
	}
	var malformed int
	for i, b := range b1 {
		cmd, err := command.Decode([]byte(b))
		switch {
		case errors.Is(err, command.ErrMalformed):
			malformed++
		case err != nil:
			t.Errorf("message %d: %v", i, err)
		case cmd.Kind == command.KindChat && l1[i] == limits.LaneSystem:
			t.Errorf("message %d: chat on the system lane", i)
		}
	}
	if malformed == 0 || malformed > 50 {
		t.Errorf("%d malformed of 5000, want a few (about 25)", malformed)
	}

	// A Mix of the same seed: the malformed message and the unknown
	// channel's first, then the same draws.
	mix := NewMix(7, 40)
	for i, want := range append([]string{string(malformedChat), string(ChatBody(UnknownChannel, "hello?"))}, b1[:100]...) {
		lane, body := mix.Next()
		wantLane := limits.LaneStandard
		if i >= 2 {
			wantLane = l1[i-2]
		}
		if lane != wantLane || string(body) != want {
			t.Fatalf("Mix message %d: %v %s, want %v %s", i, lane, body, wantLane, want)
		}
	}
}

// TestSeedChannels stores the mix's channels and the two measurement
// channels, with the bot a moderator in every fifth; Forget deletes them
// and the pause state, and nothing else.
func TestSeedChannels(t *testing.T) {
	srv := miniredis.RunT(t)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr()}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := SeedChannels(context.Background(), c, "p:", 10); err != nil {
		t.Fatal(err)
	}
	ids := []int{MeasureStd, MeasurePremium, ContractFirst, ContractFirst + 1, ContractFirst + 2, ContractFirst + 3}
	for id := FirstChannel; id < FirstChannel+10; id++ {
		ids = append(ids, id)
	}
	for _, id := range ids {
		wantMod := "0"
		if id%5 == 0 {
			wantMod = "1"
		}
		key := channels.Key("p:", strconv.Itoa(id))
		if got := srv.HGet(key, "bot_mod"); got != wantMod || srv.HGet(key, "login") != "channel"+strconv.Itoa(id) {
			t.Errorf("%s: bot_mod %q login %q", key, got, srv.HGet(key, "login"))
		}
	}
	if n := len(srv.Keys()); n != 16 {
		t.Errorf("%d keys, want 16", n)
	}
	// The pause state, and a key of another prefix that Forget leaves.
	for _, k := range append(pause.Keys("p:"), "q:"+channels.Key("p:", "1001")) {
		srv.Set(k, "1")
	}
	Forget(c, "p:", 10)
	if keys := srv.Keys(); !slices.Equal(keys, []string{"q:" + channels.Key("p:", "1001")}) {
		t.Errorf("keys after Forget: %q, want only the other prefix's", keys)
	}
}
