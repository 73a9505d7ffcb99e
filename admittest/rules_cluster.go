package admittest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/serverinfo"
)

// checkClusterHashTag: on a cluster, two keys with a common hash tag are
// one slot and decide as on a single server.
func checkClusterHashTag(ctx context.Context, e *env) error {
	if !e.cluster {
		return skipf("needs a cluster client")
	}
	p := e.prefix("cluster-hash-tag")
	std, shared := req(p+"std", hourly3), req(p+"shared", hourly3)
	s1, err := e.slotOf(ctx, std.Key)
	if err != nil {
		return err
	}
	if s2, err := e.slotOf(ctx, shared.Key); err != nil || s1 != s2 {
		return fmt.Errorf("the server puts %q and %q in slots %d and %d (%v)", std.Key, shared.Key, s1, s2, err)
	}
	for _, tc := range []struct {
		name          string
		first, second *seedAt
		want          uint8
	}{{"both fresh", nil, nil, 0}, {"second empty", nil, &seedAt{0, -sec}, 2}, {"first empty", &seedAt{0, -sec}, nil, 1}} {
		seeds := map[string]seedAt{}
		if tc.first != nil {
			seeds[std.Key] = *tc.first
		}
		if tc.second != nil {
			seeds[shared.Key] = *tc.second
		}
		d, err := e.decideAndCompare(ctx, e.l, std, &shared, seeds)
		if err == nil && d.Denied != tc.want {
			err = fmt.Errorf("decision %v, want Denied %d", d, tc.want)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", tc.name, err)
		}
	}
	return nil
}

// checkClusterCrossSlot: on a cluster, a pair of keys that the server puts
// in different slots fails with ErrCrossSlot and ErrNotExecuted before
// anything is sent, and a pair it puts in one slot decides, for hash tags
// that are easy to parse wrongly: an empty first tag ("{}{T}" hashes the
// whole key), a brace inside the tag ("{{T}" has the tag "{T"), and a
// second tag after the first ("{T}{U}" has the tag T).
func checkClusterCrossSlot(ctx context.Context, e *env) error {
	if !e.cluster {
		return skipf("needs a cluster client")
	}
	p := e.prefix("cross-slot")
	tag := strings.TrimSuffix(strings.TrimPrefix(p, e.base+"{"), "}:")
	first := req(p+"std", hourly3)
	slot, err := e.slotOf(ctx, first.Key)
	if err != nil {
		return err
	}
	seconds := []string{
		e.base + "{other}:shared", e.base + "{other:1}:shared", e.base + "{other:2}:shared",
		e.base + "{}{" + tag + "}:shared", e.base + "{{" + tag + "}:shared", e.base + tag + "}:shared",
		e.base + "{" + tag + "}{other}:shared", e.base + "{" + tag + "}}:shared",
	}
	scripts := func() (int64, error) {
		if !e.quiet() {
			return 0, nil
		}
		var n int64
		for _, node := range e.admin.Nodes() {
			s, err := serverinfo.CommandStats(ctx, node)
			if err != nil {
				return 0, err
			}
			n += s["evalsha"].Calls + s["eval"].Calls
		}
		return n, nil
	}
	var errs []error
	refused := 0
	for _, key := range seconds {
		second := req(key, hourly3)
		s2, err := e.slotOf(ctx, key)
		if err != nil {
			return err
		}
		n0, err := scripts()
		if err != nil {
			return err
		}
		d, err := allowRecovered(ctx, e.l, first, &second)
		n1, serr := scripts()
		if serr != nil {
			return serr
		}
		if s2 == slot {
			if err != nil {
				errs = append(errs, fmt.Errorf("%s and %s, both in slot %d: %v, want a decision", e.short(first.Key), e.short(key), slot, err))
			}
			continue
		}
		refused++
		if !errors.Is(err, admit.ErrCrossSlot) || !errors.Is(err, admit.ErrNotExecuted) || d != (admit.Decision{}) {
			errs = append(errs, fmt.Errorf("%s (slot %d) and %s (slot %d): got %v, %v; want ErrCrossSlot and ErrNotExecuted", e.short(first.Key), slot, e.short(key), s2, d, err))
			continue
		}
		for _, k := range []string{first.Key, key} {
			if s, err := e.snap(ctx, k); err != nil || s.exists {
				errs = append(errs, fmt.Errorf("%s: %v (%v), want absent", e.short(k), s, err))
			}
		}
		if n1 != n0 {
			errs = append(errs, fmt.Errorf("%s and %s: %d script commands ran on the cluster, want none", e.short(first.Key), e.short(key), n1-n0))
		}
	}
	if refused < 3 {
		errs = append(errs, fmt.Errorf("only %d of the pairs are in different slots: the rule proves too little", refused))
	}
	return errors.Join(errs...)
}

// allowRecovered is AllowOrdered, with a panic (valkey-go's cluster client
// panics on a command whose keys are in different slots) made an error.
func allowRecovered(ctx context.Context, l *admit.Limiter, first admit.Request, second *admit.Request) (d admit.Decision, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("AllowOrdered panicked: %v", r)
		}
	}()
	return l.AllowOrdered(ctx, first, second)
}

// checkClusterShards: buckets on different primaries decide independently:
// draining one leaves the others as they were.
func checkClusterShards(ctx context.Context, e *env) error {
	if !e.cluster {
		return skipf("needs a cluster client")
	}
	primaries := map[string]bool{}
	for _, r := range e.slots {
		primaries[r.addr] = true
	}
	if len(primaries) < 2 {
		return skipf("needs a cluster of at least 2 primaries, this one has %d", len(primaries))
	}
	byNode := map[string]string{} // node address → a prefix whose slot it serves
	var prefixes []string
	for i := 0; i < 1000 && len(byNode) < len(primaries); i++ {
		p := e.prefix("shards")
		_, addr, err := e.node(ctx, p)
		if err != nil {
			return err
		}
		if _, ok := byNode[addr]; !ok {
			byNode[addr] = p
			prefixes = append(prefixes, p)
		}
	}
	if len(prefixes) < len(primaries) {
		return fmt.Errorf("found buckets on %d of the %d primaries in 1000 tries", len(prefixes), len(primaries))
	}
	spec := admit.MustSpec(admit.Every(time.Hour), 2)
	drained := req(prefixes[0]+"b", spec)
	for i, want := range []uint8{0, 0, 1} {
		if d, err := e.l.AllowOrdered(ctx, drained, nil); err != nil || d.Denied != want {
			return fmt.Errorf("draining the bucket on the first primary, call %d: %v, %v; want Denied %d", i, d, err, want)
		}
	}
	for _, p := range prefixes[1:] {
		std, shared := req(p+"std", spec), req(p+"shared", spec)
		if _, err := e.decideAndCompare(ctx, e.l, std, &shared, nil); err != nil {
			return fmt.Errorf("bucket pair on another primary: %w", err)
		}
		n, addr, err := e.node(ctx, p)
		if err != nil {
			return err
		}
		if got, err := n.Do(ctx, n.B().Exists().Key(std.Key, shared.Key).Build()).AsInt64(); err != nil || got != 2 {
			return fmt.Errorf("node %s holds %d of the pair's keys (%v), want 2", addr, got, err)
		}
	}
	return nil
}
