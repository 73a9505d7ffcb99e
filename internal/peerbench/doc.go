// Package peerbench measures admit's server time beside the most-used peer,
// go-redis/redis_rate v10, run as its users run it: a dependency of this
// module (not copied code), called through go-redis with its default
// options. It holds only a benchmark, BenchmarkRedisRateSaturation; the
// module is nested so that neither redis_rate nor go-redis enters admit's
// go.mod.
//
//	cd internal/peerbench && go test -run '^$' -bench . -benchtime 5x
package peerbench
