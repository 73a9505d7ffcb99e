package admit

import (
	"crypto/fips140"
	_ "embed"
	"sync"

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
var scripts = sync.OnceValue(func() (s struct{ take, peek *valkey.Lua }) {
	if fips140.Enabled() {
		s.take = valkey.NewLuaScript(scriptSource, valkey.WithLoadSHA1(true))
		s.peek = valkey.NewLuaScriptReadOnly(scriptSource, valkey.WithLoadSHA1(true))
		return s
	}
	s.take = valkey.NewLuaScript(scriptSource)
	s.peek = valkey.NewLuaScriptReadOnly(scriptSource)
	return s
})
