// Package benchmarks measures admit against a real server: what a decision
// costs beside the designs it replaces, the Budget calls, an overload, and
// the server's own time per script call beside the previous release, the
// floors and the peer go-redis/redis_rate. It holds benchmarks only;
// BENCHMARKS.md, at the repository's root, says how to run them and holds
// the current figures.
//
// It is a module of its own, as go-limiter keeps its benchmarks, so that
// what only they need (redis_rate and its client go-redis) stays out of
// admit's go.mod. It reads the shipped script from ../script.lua and the
// previous release's from ../testdata, so run it from this directory:
//
//	ADMIT_REQUIRE_SERVER=1 go test -run '^$' -bench . ./...
package benchmarks
