package admit

import (
	_ "embed"

	"github.com/valkey-io/valkey-go"
)

// scriptSource is the one server-side step of every decision. It starts with
// the "#!lua" shebang (Valkey 7.2+, Redis 7.0+): a script so marked is known
// to write, so a server over maxmemory refuses it with OOM before it runs,
// instead of failing it halfway.
//
//go:embed script.lua
var scriptSource string

// orderedScript runs through EVALSHA, falling back to EVAL on NOSCRIPT. It is
// deliberately not retryable: a retry after a lost reply would consume tokens
// twice.
var orderedScript = valkey.NewLuaScript(scriptSource)
