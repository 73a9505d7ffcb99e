package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// ErrUnknownChannel: Valkey has no metadata for the channel. Redelivery will
// not help, so the worker drops the command.
var ErrUnknownChannel = errors.New("outgress: unknown channel")

// Channel is the metadata the worker needs to act in a channel, plus the
// channel's chat bucket keys, built once when the channel is loaded.
type Channel struct {
	ID       string // broadcaster id
	Login    string
	BotIsMod bool // the bot is a moderator there: the larger chat limit applies

	standardKey, sharedKey string
}

// ChannelCacheConfig configures a ChannelCache. Zero fields take the
// defaults named.
type ChannelCacheConfig struct {
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

// ChannelCache serves channel metadata from memory for TTL after loading it
// with one HGETALL of the hash at "<prefix>chan:{chan:<id>}" (fields login,
// bot_mod "1" or "0"). Concurrent misses for one channel share one load,
// which no caller's cancellation stops. It is safe for concurrent use.
type ChannelCache struct {
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

// NewChannelCache returns an empty cache on c.
func NewChannelCache(c valkey.Client, cfg ChannelCacheConfig) *ChannelCache {
	if cfg.TTL <= 0 {
		cfg.TTL = 24 * time.Hour
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = 100000
	}
	if cfg.LoadTimeout <= 0 {
		cfg.LoadTimeout = 2 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &ChannelCache{
		c: c, prefix: cfg.Prefix, ttl: cfg.TTL, max: cfg.MaxEntries, now: cfg.Now, loadTimeout: cfg.LoadTimeout,
		entries: map[string]cacheEntry{}, inflight: map[string]*channelLoad{},
	}
}

// Get returns the channel and where it came from: memory when it was loaded
// less than TTL ago (CacheHit), else Valkey (CacheMiss: one HGETALL), or
// another caller's load of the same channel that was already in flight
// (CacheJoined: no command of its own). A channel Valkey does not know gives
// ErrUnknownChannel and is not cached.
func (cc *ChannelCache) Get(ctx context.Context, id string) (*Channel, CacheUse, error) {
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
func (cc *ChannelCache) runLoad(ctx context.Context, id string, l *channelLoad) {
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
func (cc *ChannelCache) store(id string, e cacheEntry) {
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

func (cc *ChannelCache) load(ctx context.Context, id string) (*Channel, error) {
	fields, err := cc.c.Do(ctx, cc.c.B().Hgetall().Key(channelKey(cc.prefix, id)).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("outgress: loading channel: %w", err)
	}
	if len(fields) == 0 {
		return nil, ErrUnknownChannel
	}
	ch := &Channel{ID: id, Login: fields["login"], BotIsMod: fields["bot_mod"] == "1"}
	ch.standardKey, ch.sharedKey = chatKeys(cc.prefix, id)
	return ch, nil
}

// channelKey is the key of a channel's metadata hash.
func channelKey(prefix, id string) string { return prefix + "chan:{chan:" + id + "}" }
