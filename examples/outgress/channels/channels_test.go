package channels

import (
	"context"
	"errors"
	"github.com/admitkit/admit/examples/outgress/counting"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// TestChannelCacheOneLoadPerDay steps a fake clock through the 24 h TTL: a
// miss costs exactly one HGETALL, a hit nothing.
func TestChannelCacheOneLoadPerDay(t *testing.T) {
	e := newEnv(t)
	e.seed(t, "42", true)
	var clock atomic.Int64
	t0 := time.Now()
	clock.Store(t0.UnixNano())
	cc := New(e.c, Config{Prefix: e.prefix, Now: func() time.Time { return time.Unix(0, clock.Load()) }})

	steps := []struct {
		at       time.Duration
		want     CacheUse
		commands int64
	}{
		{0, CacheMiss, 1},
		{time.Minute, CacheHit, 0},
		{24*time.Hour - 1, CacheHit, 0},
		{24 * time.Hour, CacheMiss, 1}, // loaded at 0: expired now
		{48*time.Hour - 1, CacheHit, 0},
	}
	for i, s := range steps {
		clock.Store(t0.Add(s.at).UnixNano())
		before, _ := e.c.Totals()
		ch, use, err := cc.Get(testenv.Ctx(t), "42")
		after, _ := e.c.Totals()
		if err != nil || use != s.want || after-before != s.commands {
			t.Errorf("step %d (+%v): %v, %v, %d commands; want %v, %d commands", i, s.at, use, err, after-before, s.want, s.commands)
			continue
		}
		std, shared := ChatKeys(e.prefix, "42")
		if ch.ID != "42" || ch.Login != "channel42" || !ch.BotIsMod || ch.StandardKey != std || ch.SharedKey != shared {
			t.Errorf("step %d: channel %+v", i, ch)
		}
	}
}

// TestChannelCacheUnknownChannel: a channel Valkey does not know is an
// error, and is not cached.
func TestChannelCacheUnknownChannel(t *testing.T) {
	e := newEnv(t)
	cc := New(e.c, Config{Prefix: e.prefix})
	for i := range 2 {
		before, _ := e.c.Totals()
		_, _, err := cc.Get(testenv.Ctx(t), "404")
		after, _ := e.c.Totals()
		if !errors.Is(err, ErrUnknown) || after-before != 1 {
			t.Errorf("attempt %d: %v after %d commands; want ErrUnknown after 1", i, err, after-before)
		}
	}
}

// TestChannelCacheConcurrentMissesShareOneLoad holds the first HGETALL
// until 15 more callers wait for the same channel: all 16 get it from one
// command.
func TestChannelCacheConcurrentMissesShareOneLoad(t *testing.T) {
	cc, loads, release := heldLoads(t, "7", "seven")

	const callers = 16
	var wg sync.WaitGroup
	var uses [NumCacheUses]atomic.Int64
	chans := make([]*Channel, callers)
	for i := range callers {
		wg.Go(func() {
			ch, use, err := cc.Get(testenv.Ctx(t), "7")
			if err != nil {
				t.Error(err)
			}
			chans[i] = ch
			uses[use].Add(1)
		})
	}
	if !testenv.WaitFor(func() bool { return loads.Load() == 1 && cc.waiting.Load() == callers-1 }) {
		t.Errorf("%d loads, %d waiting; want 1 and %d", loads.Load(), cc.waiting.Load(), callers-1)
	}
	close(release)
	wg.Wait()
	if loads.Load() != 1 || uses[CacheMiss].Load() != 1 || uses[CacheJoined].Load() != callers-1 {
		t.Errorf("%d HGETALLs, %d misses, %d joined; want 1, 1, %d", loads.Load(), uses[CacheMiss].Load(), uses[CacheJoined].Load(), callers-1)
	}
	for i, ch := range chans {
		if ch != chans[0] || ch == nil {
			t.Errorf("caller %d got %p, caller 0 %p: want the one loaded channel", i, ch, chans[0])
		}
	}
}

// TestChannelCacheBounded: past MaxEntries, entries are evicted.
func TestChannelCacheBounded(t *testing.T) {
	raw := testenv.Client(t, testenv.Shared(t).Addr)
	prefix := testenv.Prefix(t)
	cc := New(raw, Config{Prefix: prefix, MaxEntries: 2})
	for _, id := range []string{"1", "2", "3", "4"} {
		if err := raw.Do(testenv.Ctx(t), raw.B().Hset().Key(Key(prefix, id)).FieldValue().FieldValue("login", "c"+id).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := cc.Get(testenv.Ctx(t), id); err != nil {
			t.Fatal(err)
		}
		if n := len(cc.entries); n > 2 {
			t.Fatalf("%d entries after loading %s, want at most 2", n, id)
		}
	}
	if _, use, _ := cc.Get(testenv.Ctx(t), "4"); use != CacheHit {
		t.Errorf("the newest entry was evicted: %v", use)
	}
}

// TestChannelCacheFirstCallerCancelled holds the first caller's HGETALL
// while two more callers join its load, then cancels the first caller. The
// load belongs to no caller: the first gets its own cancellation, the two
// others get the channel, from the one HGETALL.
func TestChannelCacheFirstCallerCancelled(t *testing.T) {
	cc, loads, release := heldLoads(t, "8", "eight")

	firstCtx, cancelFirst := context.WithCancel(testenv.Ctx(t))
	firstErr := make(chan error, 1)
	go func() {
		_, _, err := cc.Get(firstCtx, "8")
		firstErr <- err
	}()
	if !testenv.WaitFor(func() bool { return loads.Load() == 1 }) {
		t.Fatal("the first caller's HGETALL was never sent")
	}
	type result struct {
		ch  *Channel
		use CacheUse
		err error
	}
	others := make(chan result, 2)
	for range 2 {
		go func() {
			ch, use, err := cc.Get(testenv.Ctx(t), "8")
			others <- result{ch, use, err}
		}()
	}
	if !testenv.WaitFor(func() bool { return cc.waiting.Load() == 2 }) {
		t.Fatalf("%d callers waiting on the load, want 2", cc.waiting.Load())
	}
	cancelFirst()
	select {
	case err := <-firstErr:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("first caller: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the cancelled first caller did not return while the load was held")
	}
	close(release)
	for i := range 2 {
		r := <-others
		if r.err != nil || r.ch == nil || r.ch.Login != "eight" || r.use != CacheJoined {
			t.Errorf("caller %d: %+v, %v, %v; want channel eight, joined, no error", i+2, r.ch, r.use, r.err)
		}
	}
	if n := loads.Load(); n != 1 {
		t.Errorf("%d HGETALLs, want 1", n)
	}
	if _, use, err := cc.Get(testenv.Ctx(t), "8"); err != nil || use != CacheHit {
		t.Errorf("after the load: %v, %v; want a hit (the detached load was cached)", use, err)
	}
}

// heldLoads stores channel id with login, and returns a cache whose
// HGETALLs are counted in loads and held until release is closed.
func heldLoads(t *testing.T, id, login string) (_ *Cache, loads *atomic.Int64, release chan struct{}) {
	raw := testenv.Client(t, testenv.Shared(t).Addr)
	prefix := testenv.Prefix(t)
	if err := raw.Do(testenv.Ctx(t), raw.B().Hset().Key(Key(prefix, id)).FieldValue().FieldValue("login", login).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	loads, release = new(atomic.Int64), make(chan struct{})
	c := &counting.Client{Client: raw, Gate: func(cmd valkey.Completed) {
		if testenv.IsCommand(cmd, "HGETALL") {
			loads.Add(1)
			<-release
		}
	}}
	return New(c, Config{Prefix: prefix}), loads, release
}

// TestMain stops the shared test servers after the last test.
func TestMain(m *testing.M) { testenv.Main(m) }

// env is a cache's view of the shared test server: a counting client and a
// key prefix of the test's own.
type env struct {
	raw    valkey.Client
	c      *counting.Client
	prefix string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	raw := testenv.Client(t, testenv.Shared(t).Addr)
	return &env{raw: raw, c: &counting.Client{Client: raw}, prefix: testenv.Prefix(t)}
}

// seed stores a channel's metadata.
func (e *env) seed(t *testing.T, id string, mod bool) {
	t.Helper()
	flag := "0"
	if mod {
		flag = "1"
	}
	err := e.raw.Do(testenv.Ctx(t), e.raw.B().Hset().Key(Key(e.prefix, id)).FieldValue().
		FieldValue("login", "channel"+id).FieldValue("bot_mod", flag).Build()).Error()
	if err != nil {
		t.Fatal(err)
	}
}
