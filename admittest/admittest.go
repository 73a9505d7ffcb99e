// Package admittest is admit's conformance suite: every rule of admit's
// design, checked against a real Valkey (or Redis) server through the
// caller's own client, with its TLS configuration, ACL user and cluster
// topology.
//
// Typical usage inside a test:
//
//	func TestAdmitConformance(t *testing.T) {
//		opt := valkey.ClientOption{InitAddress: []string{addr}, Username: "limiter", Password: pass}
//		client, err := valkey.NewClient(opt)
//		if err != nil {
//			t.Fatal(err)
//		}
//		defer client.Close()
//		admittest.Run(t, client, admittest.WithClientOption(opt))
//	}
//
// Run runs each rule as a subtest named after the rule ("transitions",
// "wrong-type-writes-nothing", ...). A failure names the rule, what was
// expected and what the server did. Rules that cannot be checked on the
// deployment (the cluster rules on a standalone server, say) skip and say
// why. Run it under the race detector: some rules race 64 goroutines.
//
// # What the suite does to the server
//
// It writes only keys under its prefix ("admittest:<random>:" unless
// [WithPrefix] says otherwise); each rule's keys share one hash tag, so they
// stay in one cluster slot. At the end it deletes those keys and nothing else
// (SCAN MATCH on every node, then DEL). It reads TIME, INFO, CLUSTER SLOTS
// and CLUSTER KEYSLOT, and the DUMP and PEXPIRETIME of its own keys. It opens
// short-lived connections to the server through a TCP proxy it runs on
// 127.0.0.1, which loses replies on purpose and records what the client
// sends. Without [Owned] it never runs FLUSHALL, FLUSHDB, SCRIPT FLUSH,
// CONFIG SET, CLIENT KILL, DEBUG or SHUTDOWN, and it does not compare the
// server's command counters, which other clients move; the proxy's exact
// counts stand in.
//
// With [Owned], which declares the server the suite's alone, it also runs
// SCRIPT FLUSH on the node that holds a rule's keys (emptying that node's
// whole script cache) and requires INFO commandstats to move exactly by its
// own commands.
//
// With [Owned] or [WithAdmin], the rule peek-read-only-user also creates a
// short-lived ACL user ("admittest-peek-" and random hex digits, allowed
// only the commands of a peek on the rule's keys) with ACL SETUSER on the
// node that holds the rule's keys, and deletes it with ACL DELUSER when the
// rule ends.
//
// The suite needs Valkey 7.2+ or Redis 7.0+ (it reads PEXPIRETIME). It takes
// a few seconds against a server on the same machine.
package admittest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/suitehook"
)

// Run runs every conformance rule against client, each as a subtest of t
// named after its rule. Every Limiter the suite tests is built with
// admit.New. Run deletes the keys it wrote when t ends.
func Run(t *testing.T, client valkey.Client, opts ...Option) {
	t.Helper()
	d := open(t, client, opts)
	t.Logf("admittest: %s; keys under %q", d.target(), d.base)
	start := time.Now()
	for _, r := range d.rules(func(c valkey.Client) *admit.Limiter { return admit.New(c) }) {
		t.Run(r.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), ruleTimeout)
			defer cancel()
			err := r.Run(ctx)
			if reason, ok := suitehook.IsSkip(err); ok {
				t.Skip(reason)
			}
			if err != nil {
				t.Errorf("rule %s broken on %s:\n%v", r.Name, d.target(), err)
			}
		})
	}
	t.Logf("admittest: %s in %v", d.target(), time.Since(start).Round(time.Millisecond))
}

// ruleTimeout bounds every rule, whatever a broken server or script does.
const ruleTimeout = 60 * time.Second

// An Option changes what Run does. The zero set of options suits a shared
// server reached without credentials.
type Option interface{ apply(*config) }

type config struct {
	owned     bool
	admin     valkey.Client
	clientOpt *valkey.ClientOption
	prefix    string
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// Owned declares the server the suite's alone: nothing else runs on it and
// its script cache may be emptied. The suite then also runs SCRIPT FLUSH and
// compares INFO commandstats exactly. Default: not owned.
func Owned() Option { return optionFunc(func(c *config) { c.owned = true }) }

// WithAdmin gives the client the suite prepares and inspects buckets with
// (DEL, HSET, PEXPIREAT, SET, RPUSH, DUMP, PEXPIRETIME, HGETALL, EXISTS, SCAN,
// TIME, INFO, CLUSTER SLOTS, CLUSTER KEYSLOT, ACL SETUSER and ACL DELUSER,
// and SCRIPT FLUSH with [Owned]),
// for when the client under test may run only what admit needs, as a
// least-privilege ACL user does. Default: the client under test.
func WithAdmin(admin valkey.Client) Option { return optionFunc(func(c *config) { c.admin = admin }) }

// WithClientOption gives the options the client under test was built with.
// The rules that put a fault proxy between a Limiter and a node dial the
// proxy with the same Username, Password, AuthCredentialsFn, SelectDB,
// ClientName and Dialer, and the proxy dials the node with the same
// TLSConfig. Default: the zero ClientOption, no credentials and no TLS.
func WithClientOption(opt valkey.ClientOption) Option {
	return optionFunc(func(c *config) { c.clientOpt = &opt })
}

// WithPrefix sets the prefix of every key the suite writes. It must be
// non-empty and hold none of the characters * ? [ ] \ { }: the suite scans
// for its keys with it, and adds a hash tag of its own after it. Default:
// "admittest:" followed by 12 random hex digits and ":". An ACL user under
// test needs the key pattern prefix + "*".
func WithPrefix(p string) Option { return optionFunc(func(c *config) { c.prefix = p }) }

func open(t *testing.T, client valkey.Client, opts []Option) *deployment {
	t.Helper()
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if client == nil {
		t.Fatal("admittest: nil client")
	}
	if cfg.prefix == "" {
		var random [6]byte
		rand.Read(random[:])
		cfg.prefix = "admittest:" + hex.EncodeToString(random[:]) + ":"
	}
	if strings.ContainsAny(cfg.prefix, `*?[]\{}`) {
		t.Fatalf("admittest: prefix %q holds one of * ? [ ] \\ { }", cfg.prefix)
	}
	d, err := newDeployment(client, cfg)
	if err != nil {
		t.Fatalf("admittest: %v", err)
	}
	t.Cleanup(func() { deleteWithPrefix(d.admin, d.base) })
	return d
}

func init() {
	suitehook.Open = func(t *testing.T, client valkey.Client, opts ...any) suitehook.Suite {
		t.Helper()
		var list []Option
		for _, o := range opts {
			opt, ok := o.(Option)
			if !ok {
				t.Fatalf("suitehook.Open: %T is not an admittest.Option", o)
			}
			list = append(list, opt)
		}
		return open(t, client, list)
	}
}

func (d *deployment) Target() string { return d.target() }

func (d *deployment) Rules(newLimiter func(valkey.Client) *admit.Limiter) []suitehook.Rule {
	return d.rules(newLimiter)
}

// rules binds every rule to an env whose Limiters newLimiter builds.
func (d *deployment) rules(newLimiter func(valkey.Client) *admit.Limiter) []suitehook.Rule {
	e := &env{deployment: d, newLimiter: newLimiter}
	e.l = newLimiter(d.client)
	var out []suitehook.Rule
	for _, r := range allRules {
		out = append(out, suitehook.Rule{Name: r.name, Run: func(ctx context.Context) error { return r.run(ctx, e) }})
	}
	return out
}

// rule is one conformance rule; see suitehook.Rule.
type rule struct {
	name string
	run  func(ctx context.Context, e *env) error
}

// allRules are the conformance rules, in the order they run.
var allRules = []rule{
	{"transitions", checkTransitions},
	{"bucket-states", checkBucketStates},
	{"first-denial-leaves-second-untouched", checkFirstDenial},
	{"second-denial-charges-first", checkSecondDenial},
	{"both-allow-consume-once", checkBothAllow},
	{"concurrency-exact-count", checkConcurrency},
	{"premium-reservation", checkPremiumReservation},
	{"host-clock-plays-no-part", checkHostClock},
	{"wrong-type-writes-nothing", checkWrongType},
	{"corrupt-state-writes-nothing", checkCorruptState},
	{"only-declared-keys", checkDeclaredKeys},
	{"one-evalsha-per-decision", checkOneEvalsha},
	{"script-flush-falls-back-once", checkScriptFlush},
	{"lost-reply-is-outcome-unknown", checkLostReply},
	{"cancel-in-flight-is-outcome-unknown", checkCancelInFlight},
	{"refused-connection-is-not-executed", checkRefused},
	{"one-state-for-both-paths", checkSharedState},
	{"key-schema", checkKeySchema},
	{"cluster-hash-tag", checkClusterHashTag},
	{"cluster-cross-slot-refused", checkClusterCrossSlot},
	{"cluster-shards-independent", checkClusterShards},
}

func skipf(format string, args ...any) error {
	return &suitehook.SkipError{Reason: fmt.Sprintf(format, args...)}
}
