package admit

import (
	"crypto/fips140"
	_ "embed"
	"strings"
	"sync"

	"github.com/admitkit/admit/internal/scriptsource"
	"github.com/valkey-io/valkey-go"
)

// scriptSource is the one server-side step of every decision.
//
// It has no "#!lua" shebang line, on purpose (docs/newer-servers.md, measured
// on Valkey 8.0 to 9.1 and Redis 7.0 and 8.0). A shebang without
// flags=no-writes makes every *_RO command refuse the script, so Peek could
// not run, on a replica or anywhere; with no-writes a take cannot write: one
// source for both can carry none. Without one, a server over maxmemory refuses
// only the script's first write, which follows every read: an admission fails
// with no key changed (TestIntegrationOOMWritesNothing), and denials and Peek
// are still decided (TestIntegrationOOMStillDenies), where a shebang would
// have the server refuse every call up front. Without the shebang the same
// bytes also run on miniredis, so the unit tests and the in-process quickstart
// run exactly the script that ships.
//
//go:embed script.lua
var scriptSource string

func init() {
	scriptsource.Of = func(l any) string { return l.(*Limiter).source }
}

// scripts returns the script every Limiter runs, twice: take and refund
// through EVALSHA, peek through EVALSHA_RO (so that it runs for read-only
// users and on replicas), each falling back to EVAL (EVAL_RO) on NOSCRIPT.
// The source is the same, so the server caches one script. Neither is
// retryable: a retry after a lost reply would consume tokens twice.
//
// They are built on first use, not at package init: valkey-go computes the
// script's SHA-1 when it builds it, and under GODEBUG=fips140=only SHA-1
// panics, which at init would kill any program that merely imports admit.
// In FIPS 140 mode the SHA-1 is not computed here at all: valkey-go asks the
// server for it with one SCRIPT LOAD on the first call (so the ACL user
// needs +script|load too), then uses EVALSHA as usual.
//
// unchecked is the script without its ACL precheck ([WithoutACLPrecheck]):
// another source, so another SHA-1 and its own EVALSHA, falling back to EVAL
// on NOSCRIPT like take, for take and refund only (peek writes nothing).
var scripts = sync.OnceValue(func() (s struct{ take, peek, unchecked *valkey.Lua }) {
	unchecked := withoutACLPrecheck(scriptSource)
	if fips140.Enabled() {
		s.take = valkey.NewLuaScript(scriptSource, valkey.WithLoadSHA1(true))
		s.peek = valkey.NewLuaScriptReadOnly(scriptSource, valkey.WithLoadSHA1(true))
		s.unchecked = valkey.NewLuaScript(unchecked, valkey.WithLoadSHA1(true))
		return s
	}
	s.take = valkey.NewLuaScript(scriptSource)
	s.peek = valkey.NewLuaScriptReadOnly(scriptSource)
	s.unchecked = valkey.NewLuaScript(unchecked)
	return s
})

// The line of script.lua that fetches the ACL precheck's function, and what
// [WithoutACLPrecheck]'s script has in its place: with acl nil, step 4 of
// the script checks nothing. TestWithoutACLPrecheckSource requires the line
// exactly once in script.lua, and the variant to differ by that line only.
const (
	aclPrecheckLine = "local acl = redis.acl_check_cmd --@acl"
	aclSkippedLine  = "local acl = nil --@acl"
)

// withoutACLPrecheck is src with its ACL precheck turned off.
func withoutACLPrecheck(src string) string {
	return strings.Replace(src, aclPrecheckLine, aclSkippedLine, 1)
}
