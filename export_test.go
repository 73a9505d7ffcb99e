package admit

import "github.com/valkey-io/valkey-go"

// What admit's external tests (package admit_test) may reach of the
// package's insides: TestMutants builds Limiters around broken copies of the
// script and runs admittest's rules against them.

// ScriptSource is the script as shipped.
var ScriptSource = scriptSource

// NewLimiterWithScript returns a Limiter that runs src instead of the
// shipped script.
func NewLimiterWithScript(c valkey.Client, src string) *Limiter {
	return newLimiter(c, valkey.NewLuaScript(src))
}

// LeastPrivilegeACL is the README's least-privilege ACL rules for admit's
// user, without the key pattern.
const LeastPrivilegeACL = leastPrivilege
