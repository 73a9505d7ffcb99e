package admit

import (
	_ "embed"

	"github.com/valkey-io/valkey-go"
)

// scriptSource is the one server-side step of every decision.
//
// It has no "#!lua" shebang line, on purpose. The shebang would make a server
// over maxmemory refuse the script before it runs; without it the server
// refuses the script's first write instead, and the script writes only after
// every read, so either way an OOM leaves no key changed (proven against a
// real server by TestIntegrationOOMWritesNothing). Without the shebang the
// same bytes also run on miniredis, so the unit tests and the in-process
// quickstart run exactly the script that ships.
//
//go:embed script.lua
var scriptSource string

// orderedScript runs through EVALSHA, falling back to EVAL on NOSCRIPT. It is
// deliberately not retryable: a retry after a lost reply would consume tokens
// twice.
var orderedScript = valkey.NewLuaScript(scriptSource)
