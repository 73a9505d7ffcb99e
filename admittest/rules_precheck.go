package admittest

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/aclrules"
	"github.com/admitkit/admit/internal/scriptsource"
)

// An aclPrecheck is one call of the script's ACL precheck, as its source
// writes it: the command and the arguments after it, as Lua expressions.
type aclPrecheck struct {
	line    int
	command string
	args    []string
}

var (
	// The one form a precheck may take: under pcall, the command a
	// literal, then its arguments, none of them a call or a table.
	precheckCall = regexp.MustCompile(`pcall\((?:acl|redis\.acl_check_cmd|server\.acl_check_cmd), '([A-Za-z|]+)'((?:, [^,()]+)*)\)`)
	// Any call of the precheck's function, in whatever form.
	anyPrecheck = regexp.MustCompile(`\bacl\s*\(|acl_check_cmd\s*\(`)
)

// aclPrechecks returns every precheck in src, a Lua script, and an error
// naming each call of the precheck's function that is not of the one form
// (not under pcall, or not parsable here).
func aclPrechecks(src string) ([]aclPrecheck, error) {
	var out []aclPrecheck
	var errs []error
	for i, line := range strings.Split(src, "\n") {
		code, _, _ := strings.Cut(line, "--") // the script's strings hold no "--"
		for _, m := range precheckCall.FindAllStringSubmatch(code, -1) {
			c := aclPrecheck{line: i + 1, command: strings.ToUpper(m[1])}
			for _, a := range strings.Split(m[2], ",")[1:] {
				c.args = append(c.args, strings.TrimSpace(a))
			}
			out = append(out, c)
		}
		if n, direct := len(precheckCall.FindAllString(code, -1)), len(anyPrecheck.FindAllString(code, -1)); direct > 0 {
			errs = append(errs, fmt.Errorf("line %d calls the ACL precheck outside pcall (a check the server raises on would fail the script): %s", i+1, strings.TrimSpace(code)))
		} else if n == 0 && strings.Contains(code, "pcall(acl") {
			errs = append(errs, fmt.Errorf("line %d: a precheck this rule cannot read: %s", i+1, strings.TrimSpace(code)))
		}
	}
	return out, errors.Join(errs...)
}

// checkACLPrecheckArity: every ACL precheck in the Limiter's script passes
// its command a number of arguments that the server's own command table
// (COMMAND INFO's arity) accepts, and runs under pcall. redis.acl_check_cmd
// is documented as taking the command with its arguments, and Redis 8.0.2's
// security update refuses a call whose count is wrong: a precheck that
// passes the key alone fails every admission there. This checks the count
// on any server, so a script that relies on a lenient server fails here
// too.
func checkACLPrecheckArity(ctx context.Context, e *env) error {
	if scriptsource.Of == nil {
		return skipf("the Limiter's script source is not known")
	}
	src := scriptsource.Of(e.l)
	if src == "" {
		return skipf("the Limiter's script source is not known (a Limiter not built by admit.New)")
	}
	calls, err := aclPrechecks(src)
	if err != nil {
		return err
	}
	if len(calls) == 0 {
		return errors.New("the script has no ACL precheck of the form pcall(acl, 'COMMAND', key, args...)")
	}
	var names []string
	seen := map[string]bool{}
	for _, c := range calls {
		if !seen[c.command] {
			seen[c.command] = true
			names = append(names, c.command)
		}
	}
	info, err := e.admin.Do(ctx, e.admin.B().CommandInfo().CommandName(names...).Build()).ToArray()
	if err != nil {
		return fmt.Errorf("COMMAND INFO %s: %w", strings.Join(names, " "), err)
	}
	// Entries are taken by the name each gives, not by position: a server
	// that answers with its whole table (miniredis) is read the same way.
	arity := map[string]int64{}
	for _, entry := range info {
		fields, err := entry.ToArray()
		if err != nil || len(fields) < 2 {
			continue // nil: a command the server does not know
		}
		name, err1 := fields[0].ToString()
		a, err2 := fields[1].AsInt64()
		if err1 == nil && err2 == nil {
			arity[strings.ToUpper(name)] = a
		}
	}
	for _, name := range names {
		if _, ok := arity[name]; !ok {
			return fmt.Errorf("COMMAND INFO: the server does not know %s, which the script checks and runs", name)
		}
	}
	var errs []error
	for _, c := range calls {
		n, a := int64(1+len(c.args)), arity[c.command]
		if (a > 0 && n != a) || (a < 0 && n < -a) || a == 0 {
			want := fmt.Sprintf("exactly %d", a)
			if a < 0 {
				want = fmt.Sprintf("at least %d", -a)
			}
			errs = append(errs, fmt.Errorf("script line %d checks %s with %d words (%s %s); the server's arity for %s is %d: %s words",
				c.line, c.command, n, c.command, strings.Join(c.args, " "), c.command, a, want))
		}
	}
	return errors.Join(errs...)
}

// checkACLPrecheckPaths: as docs/acl.md's least-privilege user, every
// path that runs an ACL precheck is decided, each once: a one- and a
// two-bucket admission, a second-bucket denial, a two-bucket refund, an
// AllowOrderedOnce admission, an Acquire alone and one with a bucket, each
// with an expired holder to prune, and an Extend. Each must succeed: on a
// server that checks the precheck's arguments, a malformed one fails here.
func checkACLPrecheckPaths(ctx context.Context, e *env) error {
	if err := e.canCreateUsers(); err != nil {
		return err
	}
	p := e.prefix("acl-precheck")
	l, done, err := e.aclUser(ctx, p, aclrules.LeastPrivilege)
	if err != nil {
		return err
	}
	defer done()
	first := admit.Request{Key: p + "first", Spec: admit.MustSpec(admit.Every(time.Hour), 10)}
	second := admit.Request{Key: p + "second", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
	one := admit.Request{Key: p + "one", Spec: admit.MustSpec(admit.Every(time.Hour), 10)}
	var errs []error
	decide := func(path string, wantDenied uint8, d admit.Decision, err error) {
		if err != nil || d.Denied != wantDenied || d.Allowed() != (wantDenied == 0) {
			errs = append(errs, fmt.Errorf("%s as the least-privilege user: %+v, %v; want denied %d, no error", path, d, err, wantDenied))
		}
	}
	d, err := l.AllowOrdered(ctx, one, nil)
	decide("one-bucket admission (checks PEXPIREAT)", 0, d, err)
	d, err = l.AllowOrdered(ctx, first, &second)
	decide("two-bucket admission (checks PEXPIREAT, HSET, PEXPIREAT)", 0, d, err)
	d, err = l.AllowOrdered(ctx, first, &second)
	decide("second-bucket denial (checks PEXPIREAT, PEXPIREAT)", 2, d, err)
	if err := l.Refund(ctx, first, &second); err != nil {
		errs = append(errs, fmt.Errorf("two-bucket refund (checks PEXPIREAT, HSET, PEXPIREAT) as the least-privilege user: %v", err))
	}
	d, err = l.AllowOrderedOnce(ctx, "acl-precheck", one, nil)
	decide("AllowOrderedOnce admission (checks PEXPIREAT, SET)", 0, d, err)

	// Leases, each key with a holder that has expired, so that a grant
	// prunes: alone, and with a bucket (ZADD, ZREMRANGEBYSCORE, PEXPIREAT).
	spec := admit.MustConcurrency(2, time.Hour)
	alone, with := p+"lease-alone", p+"lease-with"
	now, err := e.serverTime(ctx, alone)
	if err != nil {
		return err
	}
	for _, key := range []string{alone, with} {
		n, _, err := e.node(ctx, key)
		if err != nil {
			return err
		}
		if err := n.Do(ctx, n.B().Zadd().Key(key).ScoreMember().ScoreMember(float64(now-sec), "expired").Build()).Error(); err != nil {
			return err
		}
	}
	x, err := l.Acquire(ctx, admit.LeaseRequest{Key: alone, Spec: spec, Name: "a"}, nil, nil)
	if err != nil || !x.Granted() {
		errs = append(errs, fmt.Errorf("Acquire alone (checks ZADD, PEXPIREAT) as the least-privilege user: %v, %v; want granted", x, err))
	}
	y, err := l.Acquire(ctx, admit.LeaseRequest{Key: with, Spec: spec, Name: "b"}, &one, nil)
	if err != nil || !y.Granted() {
		errs = append(errs, fmt.Errorf("Acquire with a bucket (checks PEXPIREAT, ZADD, ZREMRANGEBYSCORE, PEXPIREAT) as the least-privilege user: %v, %v; want granted", y, err))
	} else if ok, err := y.Extend(ctx); !ok || err != nil {
		errs = append(errs, fmt.Errorf("Extend (checks PEXPIREAT) as the least-privilege user: %v, %v; want extended", ok, err))
	}
	return errors.Join(errs...)
}
