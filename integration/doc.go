// Package integration holds admit's real-server tests of what only a real
// server shows (error classes, ACLs, out-of-memory refusals, failover,
// clock steps, a rolling deploy, a crash and restart). They stay out of
// the root package because they send the script themselves (EVALSHA, with
// ../script.lua) where a test needs raw replies, start clusters and kill
// servers: the Limiter's own real-server tests and the conformance suite's
// runs are in the root package (limiter_integration_test.go).
//
// Each test starts its server through internal/testserver: without a
// server binary it skips, unless ADMIT_REQUIRE_SERVER=1 makes that a
// failure. Run them with
//
//	VALKEY_SERVER=$(command -v valkey-server) ADMIT_REQUIRE_SERVER=1 go test ./integration
//
// docs/testing.md lists the other ways to name a server.
package integration
