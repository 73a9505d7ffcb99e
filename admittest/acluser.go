package admittest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/valkey-io/valkey-go"

	"github.com/admitkit/admit"
)

// canCreateUsers is nil when the rules may create ACL users on the
// deployment, else the reason they may not, as a skip.
func (e *env) canCreateUsers() error {
	if !e.owned && e.admin == e.client {
		return skipf("creates ACL users: needs a server that is the suite's alone (Owned) or an admin client (WithAdmin)")
	}
	return nil
}

// aclUser creates an ACL user with rules (ACL SETUSER's, after "reset on
// >password") on the node that serves prefix, allowed the keys under
// prefix only, and returns a Limiter of e's making on a client of that
// user, and the function that closes the client and deletes the user.
func (e *env) aclUser(ctx context.Context, prefix, rules string) (*admit.Limiter, func(), error) {
	n, addr, err := e.node(ctx, prefix)
	if err != nil {
		return nil, nil, err
	}
	var random [8]byte
	rand.Read(random[:])
	name, pass := "admittest-"+hex.EncodeToString(random[:4]), hex.EncodeToString(random[4:])
	rs := append([]string{"reset", "on", ">" + pass}, strings.Fields(rules)...)
	rs = append(rs, "~"+prefix+"*")
	if e.opt.SelectDB != 0 {
		rs = append(rs, "+select")
	}
	if err := n.Do(ctx, n.B().AclSetuser().Username(name).Rule(rs...).Build()).Error(); err != nil {
		if isRefusal(err) && strings.Contains(strings.ToLower(err.Error()), "unknown command") {
			return nil, nil, skipf("the server has no ACL command: %v", err)
		}
		if !e.owned {
			return nil, nil, skipf("the admin client may not create ACL users: %v", err)
		}
		return nil, nil, fmt.Errorf("ACL SETUSER %s: %w", name, err)
	}
	c, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{addr}, Username: name, Password: pass, DisableCache: true, ForceSingleClient: true,
		TLSConfig: e.opt.TLSConfig, Dialer: e.opt.Dialer, SelectDB: e.opt.SelectDB,
	})
	done := func() {
		if c != nil {
			c.Close()
		}
		n.Do(context.WithoutCancel(ctx), n.B().AclDeluser().Username(name).Build())
	}
	if err != nil {
		done()
		return nil, nil, fmt.Errorf("connect as %s: %w", name, err)
	}
	return e.newLimiter(c), done, nil
}
