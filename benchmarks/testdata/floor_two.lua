-- The two-bucket floor: the commands a two-bucket admission must
-- run, TIME once, then HMGET of each bucket, then HSET and PEXPIREAT of
-- each, in the shipped script's order, with no logic around them: no
-- argument checked, no field validated, no refill, no decision, no ACL
-- precheck, a constant reply. BenchmarkScriptServerTime calls it with the
-- shipped script's keys and arguments (the server parses them alike) and
-- reports shipped / floor: what the script's logic costs beyond the
-- commands it cannot do without. It writes whole numbers shaped as the
-- shipped script writes them for the benchmarks' open Spec (a million
-- tokens, ts in µs, an expiry in ms) and replies as it does, with an
-- integer, so each command does the same work. Not a rate limiter.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local at = t[1] * 1000 + 1000
redis.call('HMGET', KEYS[1], 'tokens', 'ts')
redis.call('HMGET', KEYS[2], 'tokens', 'ts')
redis.call('HSET', KEYS[1], 'tokens', 999999, 'ts', now)
redis.call('PEXPIREAT', KEYS[1], at)
redis.call('HSET', KEYS[2], 'tokens', 999999, 'ts', now)
redis.call('PEXPIREAT', KEYS[2], at)
return 67108797891135 -- 999999 * 2^26 + 999999
