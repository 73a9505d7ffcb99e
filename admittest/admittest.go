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
// The rules form one ordered table (decisions, budget, once, errors, wire,
// concurrency, trust, cluster); tools that need each rule's verdict, such as
// a mutation tester, get the same table from [Rules].
//
// # What the suite does to the server
//
// It writes only keys under its prefix ("admittest:<random>:" unless
// [WithPrefix] says otherwise); each rule's keys share one hash tag, so they
// stay in one cluster slot. At the end it deletes those keys and nothing else
// (SCAN MATCH on every node, then DEL). It reads TIME, INFO, CLUSTER SLOTS
// and CLUSTER KEYSLOT, and the DUMP and PEXPIRETIME of its own keys (on a
// server that does not DUMP a hash, which it finds by dumping one of its
// own, their TYPE and contents instead). It opens
// short-lived connections to the server through a TCP proxy it runs on
// 127.0.0.1, which loses replies on purpose and records what the client
// sends. Without [Owned] it never runs FLUSHALL, FLUSHDB, SCRIPT FLUSH,
// CONFIG SET, CLIENT KILL, DEBUG or SHUTDOWN, and it does not compare the
// server's command counters, which other clients move; the proxy's exact
// counts stand in.
//
// With [Owned], which declares the server the suite's alone, it also runs
// SCRIPT FLUSH on the node that holds a rule's keys (emptying that node's
// whole script cache), requires INFO commandstats to move exactly by its
// own commands (where the server reports them), and the rule
// only-declared-keys compares every key outside the prefix before and after
// its calls.
//
// With [Owned] or [WithAdmin], the rule peek-read-only-user also creates a
// short-lived ACL user ("admittest-peek-" and random hex digits, allowed
// only the commands of a peek on the rule's keys) with ACL SETUSER on the
// node that holds the rule's keys, and deletes it with ACL DELUSER when the
// rule ends. The rule lease-least-privilege-user does the same with users
// named "admittest-lease-" and random hex digits, allowed only what a
// Limiter's leases and buckets need.
//
// The suite needs Valkey 7.2+ or Redis 7.0+ (it reads PEXPIRETIME). It takes
// a few seconds against a server on the same machine.
package admittest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/serverinfo"
)

// Run runs every conformance rule against client, each as a subtest of t
// named after its rule, in the order of the suite's one table of rules.
// Every Limiter the suite tests is built with admit.New. Run deletes the
// keys it wrote when t ends.
func Run(t *testing.T, client valkey.Client, opts ...Option) {
	t.Helper()
	start := time.Now()
	d, rs := bind(t, client, nil, opts)
	for _, r := range rs {
		t.Run(r.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), ruleTimeout)
			defer cancel()
			err := r.Run(ctx)
			if reason, ok := IsSkip(err); ok {
				t.Skip(reason)
			}
			if err != nil {
				t.Errorf("rule %s (%s) broken on %s:\n%v", r.Name, r.Explanation, d.target(), err)
			}
		})
	}
	t.Logf("admittest: %s in %v", d.target(), time.Since(start).Round(time.Millisecond))
}

// A Rule is one conformance rule, bound to a deployment and to the
// Limiters under test; see [Rules].
type Rule struct {
	// Name is the rule's name, the name of its subtest under Run
	// ("transitions", "wrong-type-writes-nothing", ...). It never changes.
	Name string
	// Explanation says in one line what the rule holds the Limiter to.
	Explanation string
	// Run checks the rule. It returns nil when the deployment and the
	// Limiter obey it; an error for which [IsSkip] reports true when the
	// rule cannot be checked on this deployment (the cluster rules on a
	// standalone server, say); and otherwise an error that says what was
	// expected and what the server did. ctx bounds the check.
	Run func(ctx context.Context) error
}

// Rules returns the rules Run runs, in the same order, bound to client and
// testing the Limiters newLimiter builds (nil means admit.New without
// options) on the clients the rules use; it does not run them. It is for
// tools that need each rule's verdict rather than a failed test, such as a
// mutation tester that runs every rule against Limiters built around a
// deliberately broken script: Run is the entry point for tests. Call each
// Rule's Run in turn, not concurrently. The options are Run's; Rules
// connects as Run does (t fails at once when it cannot) and deletes the
// keys the rules wrote when t ends.
func Rules(t *testing.T, client valkey.Client, newLimiter func(valkey.Client) *admit.Limiter, opts ...Option) []Rule {
	t.Helper()
	_, rs := bind(t, client, newLimiter, opts)
	return rs
}

// bind opens the deployment and binds every rule of the table to it.
func bind(t *testing.T, client valkey.Client, newLimiter func(valkey.Client) *admit.Limiter, opts []Option) (*deployment, []Rule) {
	t.Helper()
	if newLimiter == nil {
		newLimiter = func(c valkey.Client) *admit.Limiter { return admit.New(c) }
	}
	d := open(t, client, opts)
	t.Logf("admittest: %s; keys under %q", d.target(), d.base)
	e := &env{deployment: d, newLimiter: newLimiter}
	e.l = newLimiter(d.client)
	out := make([]Rule, 0, len(rules))
	for _, r := range rules {
		out = append(out, Rule{Name: r.name, Explanation: r.explanation, Run: func(ctx context.Context) error { return r.run(ctx, e) }})
	}
	return d, out
}

// IsSkip reports whether err, returned by a [Rule]'s Run, says that the
// rule cannot be checked on this deployment, and why.
func IsSkip(err error) (reason string, ok bool) {
	var s *skipError
	if errors.As(err, &s) {
		return s.reason, true
	}
	return "", false
}

// skipError is a rule's verdict that it cannot be checked here.
type skipError struct{ reason string }

func (s *skipError) Error() string { return "skipped: " + s.reason }

func skipf(format string, args ...any) error {
	return &skipError{reason: fmt.Sprintf(format, args...)}
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
// (DEL, HSET, ZADD, ZRANGE, PEXPIREAT, PEXPIRE, SET, RPUSH, DUMP, PEXPIRETIME, PTTL,
// HGETALL, EXISTS, SCAN, TIME, INFO, CLUSTER SLOTS, CLUSTER KEYSLOT, ACL
// SETUSER and ACL DELUSER, and SCRIPT FLUSH with [Owned]; TYPE, GET and
// LRANGE on a server that does not DUMP a hash),
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
	t.Cleanup(func() { serverinfo.DeleteWithPrefix(d.admin, d.base) })
	return d
}
