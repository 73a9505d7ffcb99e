package admit_test

// The Limiter's real-server tests, behind internal/testserver's one switch
// (a server binary or address, ADMIT_REQUIRE_SERVER=1 to fail without
// one): the runners of the conformance suite (package admittest)
// every rule of the design, on miniredis in-process (the fast tier, which
// needs no server) and on a real server, standalone or cluster. Run it
// against your own deployment with
//
//	VALKEY_ADDR=host:port go test github.com/admitkit/admit -run Conformance -v
//
// (see internal/testserver for the other ways to name a server), or call
// admittest.Run from your own tests with your own client.

import (
	"context"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admittest"
	"github.com/admitkit/admit/internal/aclrules"
	"github.com/admitkit/admit/internal/minitest"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// TestConformance runs admittest against the deployment that
// testserver.Deployment selects.
func TestConformance(t *testing.T) {
	c, opts := openTarget(t)
	admittest.Run(t, c, opts...)
}

// openTarget connects to the target the environment names: VALKEY_URL, or
// else testserver.Deployment. It returns the client and the admittest
// options that describe it: Owned when the tests started the server, or
// VALKEY_ALLOW_DESTRUCTIVE=1 says it is the suite's alone.
func openTarget(t *testing.T) (valkey.Client, []admittest.Option) {
	t.Helper()
	if os.Getenv("VALKEY_URL") != "" {
		return openURL(t)
	}
	target := testserver.Deployment(t)
	opt := valkey.ClientOption{InitAddress: target.Addrs, DisableCache: true}
	c, err := valkey.NewClient(opt)
	if err != nil {
		t.Fatalf("dial %s: %v", strings.Join(target.Addrs, ","), err)
	}
	t.Cleanup(c.Close)
	if got := c.Mode() == valkey.ClientModeCluster; got != target.Cluster {
		t.Fatalf("%s: client cluster mode %v, want %v", target.Name, got, target.Cluster)
	}
	return c, describe(t, target.Name, target.Destructive(), opt)
}

func describe(t *testing.T, name string, owned bool, opt valkey.ClientOption) []admittest.Option {
	t.Helper()
	opts := []admittest.Option{admittest.WithClientOption(opt)}
	mode := "not the suite's alone: no SCRIPT FLUSH and no server command counts; VALKEY_ALLOW_DESTRUCTIVE=1 if it is"
	if owned {
		opts = append(opts, admittest.Owned())
		mode = "the suite's alone"
	}
	t.Logf("target: %s; %s", name, mode)
	return opts
}

// openURL connects to VALKEY_URL: valkey://[user:password@]host:port, or
// valkeys:// (rediss://) for TLS, with the CA certificates of the PEM file
// VALKEY_CA_FILE when set (else the system's). Where the URL's user may run
// only what admit needs, VALKEY_ADMIN_URL names a user for the suite's
// preparation and inspection, and VALKEY_PREFIX the key prefix the
// limiter user may write (admittest.WithPrefix).
func openURL(t *testing.T) (valkey.Client, []admittest.Option) {
	t.Helper()
	dial := func(env string) (valkey.Client, valkey.ClientOption) {
		opt, err := valkey.ParseURL(os.Getenv(env))
		if err != nil {
			t.Fatalf("%s: %v", env, err)
		}
		opt.DisableCache = true
		if file := os.Getenv("VALKEY_CA_FILE"); file != "" && opt.TLSConfig != nil {
			pem, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("VALKEY_CA_FILE: %v", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				t.Fatalf("VALKEY_CA_FILE=%s holds no PEM certificate", file)
			}
			opt.TLSConfig.RootCAs = pool
		}
		c, err := valkey.NewClient(opt)
		if err != nil {
			t.Fatalf("dial %s: %v", env, err)
		}
		t.Cleanup(c.Close)
		return c, opt
	}
	c, opt := dial("VALKEY_URL")
	name := "VALKEY_URL at " + strings.Join(opt.InitAddress, ",")
	if opt.TLSConfig != nil {
		name += " over TLS"
	}
	if opt.Username != "" {
		name += " as " + opt.Username
	}
	opts := describe(t, name, os.Getenv("VALKEY_ALLOW_DESTRUCTIVE") == "1", opt)
	if os.Getenv("VALKEY_ADMIN_URL") != "" {
		admin, _ := dial("VALKEY_ADMIN_URL")
		opts = append(opts, admittest.WithAdmin(admin))
	}
	if p := os.Getenv("VALKEY_PREFIX"); p != "" {
		opts = append(opts, admittest.WithPrefix(p))
	}
	return c, opts
}

// TestConformanceTLS runs the suite over TLS, on a server the test starts
// with certificates it generates, through a client that trusts only that
// test CA; the fault proxy dials the server over TLS too.
func TestConformanceTLS(t *testing.T) {
	srv := testserver.OwnTLS(t)
	opt := valkey.ClientOption{InitAddress: []string{srv.Addr}, TLSConfig: srv.TLS, DisableCache: true}
	c, err := valkey.NewClient(opt)
	if err != nil {
		t.Fatalf("dial %s over TLS: %v", srv.Addr, err)
	}
	defer c.Close()
	admittest.Run(t, c, describe(t, srv.Version+", standalone, TLS only, started by the test", true, opt)...)
}

// aclRules are the least-privilege rules of a Limiter's ACL user (docs/acl.md,
// "Least-privilege ACL"): the script and the commands it calls, on the
// keys under one prefix.
const aclRules = aclrules.LeastPrivilege

// TestConformanceACL runs the suite with a Limiter client logged in as a
// user that may run only what admit needs, on the suite's key prefix (the
// docs/acl.md documents these ACL rules); an admin client prepares and inspects.
// It also checks the user is refused outside that, so the run proves the
// rules suffice, not that the user could do anything.
func TestConformanceACL(t *testing.T) {
	srv := testserver.Own(t)
	admin := testserver.NewClient(t, srv)
	ctx := context.Background()
	const user, pass, prefix = "admit-limiter", "admit-test-password", "admittest-acl:"
	setuser := admin.B().Arbitrary("ACL", "SETUSER").Args(user, "reset", "on", ">"+pass, "~"+prefix+"*").
		Args(strings.Fields(aclRules)...).Build()
	if err := admin.Do(ctx, setuser).Error(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), admin.B().AclDeluser().Username(user).Build()) })
	opt := valkey.ClientOption{InitAddress: []string{srv.Addr}, Username: user, Password: pass, DisableCache: true}
	c, err := valkey.NewClient(opt)
	if err != nil {
		t.Fatalf("dial %s as %s: %v", srv.Addr, user, err)
	}
	defer c.Close()
	for _, cmd := range []valkey.Completed{
		c.B().Lpush().Key(prefix + "x").Element("1").Build(),
		c.B().Hset().Key("elsewhere").FieldValue().FieldValue("tokens", "1").Build(),
		c.B().Del().Key(prefix + "x").Build(),
	} {
		if err := c.Do(ctx, cmd).Error(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Fatalf("%s as %s: %v, want NOPERM: the user may do more than the ACL rules say", strings.Join(cmd.Commands(), " "), user, err)
		}
	}
	opts := append(describe(t, srv.Version+", standalone, as an ACL user with "+aclRules+" ~"+prefix+"*", true, opt),
		admittest.WithAdmin(admin), admittest.WithPrefix(prefix))
	admittest.Run(t, c, opts...)
}

// TestConformanceMiniredis runs the suite's table of rules on miniredis,
// the fast tier: the same rules as on a real server, through the same
// client, proxy and model, in-process. admittest finds what miniredis lacks
// and says so in its target line: no INFO server or commandstats (the
// proxy's counts stand in for the server's), no DUMP of a hash (keys are
// compared by type, contents and expiry), no ACL (peek-read-only-user
// skips), no cluster (the cluster rules skip). miniredis runs one command
// at a time, so the concurrency rules prove the client side and the script's
// arithmetic there, and a real server's atomicity only under TestConformance.
func TestConformanceMiniredis(t *testing.T) {
	srv := miniredis.RunT(t)
	minitest.Run(srv)
	c := minitest.Client(t, srv.Addr())
	admittest.Run(t, c, admittest.WithClientOption(minitest.Option(srv.Addr())), admittest.Owned())
}

// TestConformanceWithoutACLPrecheck runs every conformance rule against
// Limiters built with WithoutACLPrecheck, on the deployment TestConformance
// uses, whose user may run every command: there the option changes no
// rule's verdict. Of the rules with ACL users of their own,
// peek-read-only-user only peeks, which the option leaves alone, and
// acl-precheck-paths grants every command admit runs; one,
// lease-least-privilege-user, checks the precheck itself (a user refused
// a lease's later write gets NOPERM with nothing written), which the
// option removes: it is skipped here.
func TestConformanceWithoutACLPrecheck(t *testing.T) {
	c, opts := openTarget(t)
	newLimiter := func(c valkey.Client) *admit.Limiter { return admit.New(c, admit.WithoutACLPrecheck()) }
	for _, r := range admittest.Rules(t, c, newLimiter, opts...) {
		t.Run(r.Name, func(t *testing.T) {
			if r.Name == "lease-least-privilege-user" {
				t.Skip("checks the ACL precheck, which WithoutACLPrecheck removes")
			}
			ctx, cancel := context.WithTimeout(t.Context(), ruleTimeout)
			defer cancel()
			err := r.Run(ctx)
			if reason, ok := admittest.IsSkip(err); ok {
				t.Skip(reason)
			}
			if err != nil {
				t.Errorf("rule %s broken with WithoutACLPrecheck:\n%v", r.Name, err)
			}
		})
	}
}

// TestIntegrationPeekOnReplica is the conformance rule peek-on-replica,
// which needs a replica the suite cannot start: a client built with
// SendToReplicas (read-only commands to the replica) runs Peek's
// EVALSHA_RO on the replica, and AllowOrdered's and Refund's EVALSHA on the
// primary. The servers' INFO commandstats prove where each ran, and the
// peeks on the replica see the state the primary's decisions replicated.
func TestIntegrationPeekOnReplica(t *testing.T) {
	primary, replica := testserver.OwnReplicated(t)
	pAdmin, rAdmin := testserver.NewClient(t, primary), testserver.NewClient(t, replica)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// replicated waits (at most 10 s) until the replica has every write the
	// primary made: it increments a mark on the primary and polls the
	// replica for the new value; the replication stream is in order, so
	// every earlier write has reached the replica too. (WAIT would not do:
	// it counts the writes of its own connection, and valkey-go sends it on
	// a connection of its own.)
	var mark string
	replicated := func() {
		t.Helper()
		want, err := pAdmin.Do(ctx, pAdmin.B().Incr().Key(mark).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		for range 500 {
			got, err := rAdmin.Do(ctx, rAdmin.B().Get().Key(mark).Build()).AsInt64()
			if err == nil && got == want {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("the replica did not receive the primary's writes within 10s")
	}

	c, err := valkey.NewClient(valkey.ClientOption{
		InitAddress:    []string{primary.Addr},
		Standalone:     valkey.StandaloneOption{ReplicaAddress: []string{replica.Addr}},
		SendToReplicas: func(cmd valkey.Completed) bool { return cmd.IsReadOnly() },
		DisableCache:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lim := admit.New(c)
	p := testserver.Prefix(t, pAdmin)
	mark = p + "replication-mark"
	first := admit.Request{Key: p + "std", Spec: admit.MustSpec(admit.Every(time.Hour), 5), Cost: 2}
	second := admit.Request{Key: p + "shared", Spec: admit.MustSpec(admit.Every(time.Hour), 4), Cost: 1}

	// Warm both script caches (the replica's first EVALSHA_RO is a
	// NOSCRIPT, then EVAL_RO) and leave state to replicate: 3 and 3 tokens.
	if d, err := lim.AllowOrdered(ctx, first, &second); err != nil || !d.Allowed() || d.Remaining != [2]int{3, 3} {
		t.Fatalf("AllowOrdered: %v, %v, Remaining %v; want allowed with Remaining [3 3]", d, err, d.Remaining)
	}
	replicated()
	if _, err := lim.Peek(ctx, first, &second); err != nil {
		t.Fatalf("Peek: %v", err)
	}

	type counts struct{ evalsha, evalshaRO, eval, evalRO int64 }
	read := func(c valkey.Client) counts {
		s := testserver.CommandStats(t, c)
		return counts{s["evalsha"].Calls, s["evalsha_ro"].Calls, s["eval"].Calls, s["eval_ro"].Calls}
	}
	delta := func(a, b counts) counts {
		return counts{b.evalsha - a.evalsha, b.evalshaRO - a.evalshaRO, b.eval - a.eval, b.evalRO - a.evalRO}
	}
	step := func(name string, wantPrimary, wantReplica counts, calls func()) {
		t.Helper()
		p0, r0 := read(pAdmin), read(rAdmin)
		calls()
		if got := delta(p0, read(pAdmin)); got != wantPrimary {
			t.Errorf("%s: primary ran %+v, want %+v", name, got, wantPrimary)
		}
		if got := delta(r0, read(rAdmin)); got != wantReplica {
			t.Errorf("%s: replica ran %+v, want %+v", name, got, wantReplica)
		}
	}

	const peeks = 5
	step("5 peeks", counts{}, counts{evalshaRO: peeks}, func() {
		for i := range peeks {
			d, err := lim.Peek(ctx, first, &second)
			if err != nil || !d.Allowed() || d.Remaining != [2]int{1, 2} {
				t.Errorf("peek %d on the replica: %v, %v, Remaining %v; want allowed with Remaining [1 2]", i, d, err, d.Remaining)
			}
		}
	})
	step("2 decisions and a refund", counts{evalsha: 3}, counts{}, func() {
		for i, want := range []struct {
			denied    uint8
			remaining [2]int
		}{{0, [2]int{1, 2}}, {1, [2]int{1, -1}}} {
			d, err := lim.AllowOrdered(ctx, first, &second)
			if err != nil || d.Denied != want.denied || d.Remaining != want.remaining {
				t.Errorf("decision %d on the primary: %v, %v, Remaining %v; want Denied %d, Remaining %v", i, d, err, d.Remaining, want.denied, want.remaining)
			}
		}
		if err := lim.Refund(ctx, admit.Request{Key: first.Key, Spec: first.Spec, Cost: 1}, nil); err != nil {
			t.Errorf("Refund: %v", err)
		}
	})
	replicated()
	// The replica now holds 2 and 2 tokens: a peek sees the first bucket
	// admit (2 - 2 = 0 left) and the second too (2 - 1 = 1 left).
	step("a peek after replication", counts{}, counts{evalshaRO: 1}, func() {
		d, err := lim.Peek(ctx, first, &second)
		if err != nil || !d.Allowed() || d.Remaining != [2]int{0, 1} {
			t.Errorf("peek on the replica after replication: %v, %v, Remaining %v; want allowed with Remaining [0 1]", d, err, d.Remaining)
		}
	})
}
