package admit

import "github.com/valkey-io/valkey-go"

// What admit's external tests (package admit_test) may reach of the
// package's insides: TestMutants builds Limiters around broken copies of the
// script and runs admittest's rules against them.

// ScriptSource is the script as shipped.
var ScriptSource = scriptSource

// NewLimiterWithScript returns a Limiter that runs src instead of the
// shipped script, as New runs it: through EVALSHA for take and refund, and
// read-only through EVALSHA_RO for peek.
func NewLimiterWithScript(c valkey.Client, src string) *Limiter {
	return &Limiter{client: c, script: valkey.NewLuaScript(src), source: src, readOnly: valkey.NewLuaScriptReadOnly(src)}
}

// OnceKey is onceKey: the name of the record of (key, id), or the refusal
// of the pair.
var OnceKey = onceKey

// KeySlot is keySlot: a key's cluster hash slot.
var KeySlot = keySlot

// RaceEnabled reports whether the tests run under the race detector.
const RaceEnabled = raceEnabled

// newLimiter returns a Limiter that runs script for every mode, peek
// included (through EVALSHA, not EVALSHA_RO).
func newLimiter(client valkey.Client, script *valkey.Lua) *Limiter {
	return &Limiter{client: client, script: script, readOnly: script}
}

// len is the number of Wait lines a Limiter holds.
func (w *waitLines) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.lines)
}
