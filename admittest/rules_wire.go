package admittest

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/admitkit/admit"
	"github.com/valkey-io/valkey-go"
)

// checkHostClock: the script command carries no time: its exact arguments
// on the wire are the keys and the Specs' arguments, on both paths, and
// every script command names one script. The refill itself follows the
// server's TIME, which bucket-states checks to the microsecond; admit's unit
// tests run the script on a server clock decades from the host's.
func checkHostClock(ctx context.Context, e *env) error {
	p := e.prefix("host-clock")
	px, err := e.viaProxy(ctx, p, false)
	if err != nil {
		return err
	}
	defer px.close()
	l := px.l
	first, second := req(p+"std", admit.MustSpec(admit.Every(1500*time.Millisecond), 20)), req(p+"shared", admit.MustSpec(admit.Every(300*time.Millisecond), 100))
	if _, err := l.AllowOrdered(ctx, first, &second); err != nil {
		return err
	}
	if _, err := l.AllowOrdered(ctx, first, nil); err != nil {
		return err
	}
	wantArgs := map[string][]string{
		"2": {"2", first.Key, second.Key, "1500000", "20", "1", "300000", "100", "1"},
		"1": {"1", first.Key, "1500000", "20", "1"},
	}
	seen := map[string]bool{}
	var sha string
	for _, cmd := range px.commands() {
		if !isScriptCommand(cmd) || len(cmd) < 3 {
			continue
		}
		name := strings.ToUpper(cmd[0])
		h := cmd[1]
		if name == "EVAL" {
			sum := sha1.Sum([]byte(cmd[1]))
			h = hex.EncodeToString(sum[:])
		}
		if sha == "" {
			sha = h
		}
		if h != sha {
			return fmt.Errorf("%s names script %s, another script than the %s before it", name, h, sha)
		}
		if !slices.Equal(cmd[2:], wantArgs[cmd[2]]) {
			return fmt.Errorf("%s sent arguments %q, want exactly %q (keys and Spec arguments, no time)", name, cmd[2:], wantArgs[cmd[2]])
		}
		seen[cmd[2]] = true
	}
	if !seen["1"] || !seen["2"] {
		return fmt.Errorf("script commands seen on the wire: %v, want both paths", px.scripts())
	}
	return nil
}

// checkDeclaredKeys: the script writes only the keys it is given: after a
// sequence of allowed and denied calls, the rule's prefix holds exactly
// those keys (SCAN) and, on a server that is the suite's alone, every other
// key of the node is as it was before, byte for byte (SCAN and DUMP of the
// whole node), so a key written anywhere else shows too.
func checkDeclaredKeys(ctx context.Context, e *env) error {
	p := e.prefix("declared-keys")
	n, _, err := e.node(ctx, p)
	if err != nil {
		return err
	}
	// others returns every key of the node outside the suite's base, with
	// its snapshot, on a server that is the suite's alone.
	others := func() (map[string]snapshot, error) {
		if !e.owned {
			return nil, nil
		}
		keys, err := scanKeys(ctx, n, "*")
		if err != nil {
			return nil, err
		}
		m := map[string]snapshot{}
		for _, k := range keys {
			if strings.HasPrefix(k, e.base) {
				continue
			}
			if len(m) == 10_000 {
				return nil, errors.New("over 10000 keys outside the suite's prefix on a server declared the suite's alone")
			}
			v, err := e.snap(ctx, k)
			if err != nil {
				return nil, err
			}
			m[k] = v
		}
		return m, nil
	}
	before, err := others()
	if err != nil {
		return err
	}
	a, b, c := req(p+"a", admit.MustSpec(admit.Every(time.Hour), 2)), req(p+"b", admit.MustSpec(admit.Every(time.Hour), 1)), req(p+"c", hourly3)
	for _, call := range []struct {
		first  admit.Request
		second *admit.Request
	}{{a, &b}, {a, &b}, {a, &b}, {c, nil}, {b, nil}, {c, &a}} { // allow, deny 2, deny 1, allow, deny 1, deny 2
		if _, err := e.l.AllowOrdered(ctx, call.first, call.second); err != nil {
			return err
		}
	}
	after, err := others()
	if err != nil {
		return err
	}
	declared := map[string]bool{a.Key: true, b.Key: true, c.Key: true}
	found, err := scanKeys(ctx, n, p+"*")
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range found {
		if !declared[k] {
			errs = append(errs, fmt.Errorf("the script wrote %q, a key it was not given", e.short(k)))
		}
	}
	if len(found) != len(declared) {
		errs = append(errs, fmt.Errorf("found %d keys under the rule's prefix, want the %d the calls named", len(found), len(declared)))
	}
	for k, v := range after {
		if w, ok := before[k]; !ok || w != v {
			errs = append(errs, fmt.Errorf("the script wrote %q, a key outside the suite's prefix that it was not given", k))
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			errs = append(errs, fmt.Errorf("key %q, outside the suite's prefix, disappeared", k))
		}
	}
	return errors.Join(errs...)
}

// scanKeys returns the keys of node n that match pattern, in at most
// 100000 SCAN steps.
func scanKeys(ctx context.Context, n valkey.Client, pattern string) ([]string, error) {
	var keys []string
	var cursor uint64
	for range 100_000 {
		se, err := n.Do(ctx, n.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return nil, err
		}
		keys = append(keys, se.Elements...)
		if cursor = se.Cursor; cursor == 0 {
			return keys, nil
		}
	}
	return nil, errors.New("SCAN did not finish in 100000 steps")
}

// checkOneEvalsha: in steady state each decision is exactly one EVALSHA
// on the wire (counted by a proxy) and on the server (INFO commandstats,
// where the server is the suite's alone), on both paths.
func checkOneEvalsha(ctx context.Context, e *env) error {
	p := e.prefix("one-evalsha")
	px, err := e.viaProxy(ctx, p, false)
	if err != nil {
		return err
	}
	defer px.close()
	l := px.l
	spec := admit.MustSpec(1000, 1000)
	first, second := req(p+"a", spec), req(p+"b", spec)
	if _, err := l.AllowOrdered(ctx, first, &second); err != nil { // loads the script if needed
		return err
	}
	const calls = 50
	for _, path := range []struct {
		name   string
		second *admit.Request
	}{{"two buckets", &second}, {"one bucket", nil}} {
		n0 := len(px.commands())
		s0, err := e.stats(ctx, p)
		if err != nil {
			return err
		}
		for range calls {
			if _, err := l.AllowOrdered(ctx, first, path.second); err != nil {
				return err
			}
		}
		s1, err := e.stats(ctx, p)
		if err != nil {
			return err
		}
		sent := px.since(n0)
		var names []string
		for _, cmd := range sent {
			if len(cmd) > 0 && !strings.EqualFold(cmd[0], "EVALSHA") {
				names = append(names, cmd[0])
			}
		}
		if len(sent) != calls || len(names) > 0 {
			return fmt.Errorf("%s: %d decisions sent %d commands (other than EVALSHA: %v), want %d EVALSHA", path.name, calls, len(sent), names, calls)
		}
		if e.quiet() {
			if n := s1["evalsha"].Calls - s0["evalsha"].Calls; n != calls {
				return fmt.Errorf("%s: server counted %d EVALSHA for %d decisions", path.name, n, calls)
			}
			for _, cmd := range []string{"eval", "script|load", "script"} {
				if n := s1[cmd].Calls - s0[cmd].Calls; n != 0 {
					return fmt.Errorf("%s: server counted %d %s, want 0", path.name, n, cmd)
				}
			}
		}
	}
	return nil
}

// checkScriptFlush: when the server answers EVALSHA with NOSCRIPT, the
// call still decides correctly through exactly one EVALSHA and one EVAL of
// the script that SHA names, and the call after is one EVALSHA again. On a
// server that is the suite's alone the NOSCRIPT is real (SCRIPT FLUSH on the
// node, and the server's counters must agree); otherwise the proxy answers
// the EVALSHA with NOSCRIPT itself, and the server's script cache stays as
// it was.
func checkScriptFlush(ctx context.Context, e *env) error {
	p := e.prefix("script-flush")
	px, err := e.viaProxy(ctx, p, true)
	if err != nil {
		return err
	}
	defer px.close()
	l := px.l
	r := req(p+"r", admit.MustSpec(admit.Every(time.Hour), 5))
	if e.owned {
		n, _, err := e.node(ctx, p)
		if err != nil {
			return err
		}
		if err := n.Do(ctx, n.B().ScriptFlush().Build()).Error(); err != nil {
			return err
		}
	} else {
		px.mode.Store(noscriptOnce)
	}
	n0 := len(px.commands())
	var stats [3]map[string]int64
	var errs []error
	for i := range 3 {
		if e.quiet() {
			s, err := e.stats(ctx, p)
			if err != nil {
				return err
			}
			stats[i] = map[string]int64{"evalsha": s["evalsha"].Calls, "evalsha failed": s["evalsha"].Failed, "eval": s["eval"].Calls, "eval failed": s["eval"].Failed}
		}
		if i == 2 {
			break
		}
		if d, err := l.AllowOrdered(ctx, r, nil); err != nil || !d.Allowed() {
			errs = append(errs, fmt.Errorf("call %d: got %v, %v; want allowed", i+1, d, err))
		}
	}
	var got []string
	sent := px.since(n0)
	for _, cmd := range sent {
		got = append(got, strings.ToUpper(cmd[0]))
	}
	if want := []string{"EVALSHA", "EVAL", "EVALSHA"}; !slices.Equal(got, want) {
		errs = append(errs, fmt.Errorf("commands sent: %v, want %v", got, want))
	} else if sum := sha1.Sum([]byte(sent[1][1])); hex.EncodeToString(sum[:]) != sent[0][1] || sent[2][1] != sent[0][1] {
		errs = append(errs, fmt.Errorf("EVAL sent a script whose SHA-1 is %x, after EVALSHA %s", sum, sent[0][1]))
	}
	if e.quiet() {
		delta := func(i int) map[string]int64 {
			m := map[string]int64{}
			for k, v := range stats[i+1] {
				m[k] = v - stats[i][k]
			}
			return m
		}
		want1 := map[string]int64{"evalsha": 1, "evalsha failed": 1, "eval": 1, "eval failed": 0}
		want2 := map[string]int64{"evalsha": 1, "evalsha failed": 0, "eval": 0, "eval failed": 0}
		if got := delta(0); fmt.Sprint(got) != fmt.Sprint(want1) {
			errs = append(errs, fmt.Errorf("server counts for the call after the flush: %v, want %v", got, want1))
		}
		if got := delta(1); fmt.Sprint(got) != fmt.Sprint(want2) {
			errs = append(errs, fmt.Errorf("server counts for the call after that: %v, want %v", got, want2))
		}
	}
	if tk, err := e.tokensLeft(ctx, r.Key); err != nil || tk != 3 {
		errs = append(errs, fmt.Errorf("tokens %d (%v) after two decisions on a bucket of 5, want 3", tk, err))
	}
	return errors.Join(errs...)
}
