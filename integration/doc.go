// Package integration holds admit's real-server tests: the conformance
// suite (package admittest) on a standalone server, a cluster, over TLS and
// as a least-privilege ACL user, and the tests of what only a real server
// shows (error classes, ACLs, out-of-memory refusals, replicas, failover,
// clock steps, a rolling deploy). They use admit's public API, admittest
// and the repository's internal test packages, and send the script
// themselves (EVALSHA, with ../script.lua) where a test needs raw replies.
//
// Each test starts its server through internal/testserver: without a
// server binary it skips, unless ADMIT_REQUIRE_SERVER=1 makes that a
// failure. Run them with
//
//	VALKEY_SERVER=$(command -v valkey-server) ADMIT_REQUIRE_SERVER=1 go test ./integration
//
// docs/testing.md lists the other ways to name a server.
package integration
