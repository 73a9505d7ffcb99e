// Package channels is the outgress worker's 24-hour cache of channel
// metadata: a miss is one HGETALL, concurrent misses of one channel share
// one load that no caller's cancellation stops, and each channel carries
// its two chat bucket keys, built once when it is loaded.
package channels

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitkit/admit/examples/outgress/internal/defaults"
	"github.com/admitkit/admit/examples/outgress/internal/label"
	"github.com/valkey-io/valkey-go"
)

// ErrUnknown: Valkey has no metadata for the channel. Redelivery will
// not help, so the worker drops the command.
var ErrUnknown = errors.New("outgress: unknown channel")

// Channel is the metadata the worker needs to act in a channel, plus the
// channel's chat bucket keys, built once when the channel is loaded.
type Channel struct {
	ID       string // broadcaster id
	Login    string
	BotIsMod bool // the bot is a moderator there: the larger chat limit applies

	StandardKey, SharedKey string
}

// Config configures a Cache. Zero fields take the
// defaults named.
type Config struct {
	// Prefix starts every key. Default "".
	Prefix string
	// TTL is how long a loaded channel is served without asking Valkey.
	// Default 24h.
	TTL time.Duration
	// MaxEntries bounds the cache. Default 100000.
	MaxEntries int
	// LoadTimeout bounds one HGETALL. A load is shared by every caller
	// that misses the channel meanwhile and is cancelled by none of them.
	// Default 2s.
	LoadTimeout time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Cache serves channel metadata from memory for TTL after loading it
// with one HGETALL of the hash at "<prefix>chan:{chan:<id>}" (fields login,
// bot_mod "1" or "0"). Concurrent misses for one channel share one load,
// which no caller's cancellation stops. It is safe for concurrent use.
type Cache struct {
	c      valkey.Client
	prefix string
	ttl    time.Duration
	max    int

	loadTimeout time.Duration
	now         func() time.Time

	mu       sync.RWMutex
	entries  map[string]cacheEntry
	inflight map[string]*channelLoad

	waiting atomic.Int32 // callers waiting on another's load; read by tests
}

type cacheEntry struct {
	ch      *Channel
	expires time.Time // with the monotonic reading of time.Now, so a step of the wall clock moves no expiry
}

type channelLoad struct {
	done chan struct{}
	ch   *Channel
	err  error
}

// New returns an empty cache on c.
func New(c valkey.Client, cfg Config) *Cache {
	return &Cache{
		c: c, prefix: cfg.Prefix,
		ttl:         defaults.Positive(cfg.TTL, 24*time.Hour),
		max:         defaults.Positive(cfg.MaxEntries, 100000),
		loadTimeout: defaults.Positive(cfg.LoadTimeout, 2*time.Second),
		now:         defaults.Clock(cfg.Now),
		entries:     map[string]cacheEntry{}, inflight: map[string]*channelLoad{},
	}
}

// Get returns the channel and where it came from: memory when it was loaded
// less than TTL ago (CacheHit), else Valkey (CacheMiss: one HGETALL), or
// another caller's load of the same channel that was already in flight
// (CacheJoined: no command of its own). A channel Valkey does not know gives
// ErrUnknownChannel and is not cached.
func (cc *Cache) Get(ctx context.Context, id string) (*Channel, CacheUse, error) {
	now := cc.now()
	cc.mu.RLock()
	e, ok := cc.entries[id]
	cc.mu.RUnlock()
	if ok && now.Before(e.expires) {
		return e.ch, CacheHit, nil
	}

	cc.mu.Lock()
	if e, ok := cc.entries[id]; ok && now.Before(e.expires) {
		cc.mu.Unlock()
		return e.ch, CacheHit, nil
	}
	l := cc.inflight[id]
	use := CacheJoined
	if l == nil {
		// The load belongs to no caller: it runs on its own goroutine,
		// bounded by LoadTimeout, with a context that keeps the first
		// caller's values (the demo's command tally) but not its
		// cancellation. A caller that gives up leaves the others served.
		l = &channelLoad{done: make(chan struct{})}
		cc.inflight[id] = l
		use = CacheMiss
		go cc.runLoad(context.WithoutCancel(ctx), id, l)
	}
	cc.mu.Unlock()
	if use == CacheJoined {
		cc.waiting.Add(1)
		defer cc.waiting.Add(-1)
	}
	select {
	case <-l.done:
		return l.ch, use, l.err
	case <-ctx.Done():
		return nil, use, ctx.Err()
	}
}

// runLoad performs a shared load and publishes its result to every waiter.
func (cc *Cache) runLoad(ctx context.Context, id string, l *channelLoad) {
	ctx, cancel := context.WithTimeout(ctx, cc.loadTimeout)
	defer cancel()
	l.ch, l.err = cc.load(ctx, id)
	cc.mu.Lock()
	delete(cc.inflight, id)
	if l.err == nil {
		cc.store(id, cacheEntry{ch: l.ch, expires: cc.now().Add(cc.ttl)})
	}
	cc.mu.Unlock()
	close(l.done)
}

// store adds an entry, evicting when full: expired entries first, else one
// arbitrary entry. Called with mu held.
func (cc *Cache) store(id string, e cacheEntry) {
	if _, ok := cc.entries[id]; !ok && len(cc.entries) >= cc.max {
		now := cc.now()
		for k, old := range cc.entries {
			if !now.Before(old.expires) {
				delete(cc.entries, k)
			}
		}
		for k := range cc.entries {
			if len(cc.entries) < cc.max {
				break
			}
			delete(cc.entries, k)
		}
	}
	cc.entries[id] = e
}

func (cc *Cache) load(ctx context.Context, id string) (*Channel, error) {
	fields, err := cc.c.Do(ctx, cc.c.B().Hgetall().Key(Key(cc.prefix, id)).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("outgress: loading channel: %w", err)
	}
	if len(fields) == 0 {
		return nil, ErrUnknown
	}
	ch := &Channel{ID: id, Login: fields["login"], BotIsMod: fields["bot_mod"] == "1"}
	ch.StandardKey, ch.SharedKey = ChatKeys(cc.prefix, id)
	return ch, nil
}

// Key is the key of a channel's metadata hash.
func Key(prefix, id string) string { return prefix + "chan:{chan:" + id + "}" }

// CacheUse is how a message used the channel cache.
type CacheUse uint8

// The cache uses.
const (
	CacheNone   CacheUse = iota // the command acts in no channel
	CacheHit                    // served from memory
	CacheMiss                   // loaded from Valkey: one HGETALL
	CacheJoined                 // waited for another message's load of the channel
	NumCacheUses
)

var cacheUseNames = [NumCacheUses]string{"none", "hit", "miss", "joined"}

// String is the use's metric label.
func (c CacheUse) String() string { return label.Of(cacheUseNames[:], c) }

// ChatKeys returns a channel's two chat bucket keys. The hash tag
// {chan:<id>} puts both in one cluster slot, so one script can decide both.
// They are built once per channel, when the channel cache loads it. The keys
// do not depend on the moderator flag: a change of status changes the Spec
// applied to the same budget, so it neither resets nor duplicates it.
func ChatKeys(prefix, channelID string) (standard, shared string) {
	base := prefix + "rl:{chan:" + channelID + "}:chat:"
	return base + "standard", base + "shared"
}
