-- admit: ordered token-bucket admission. One call decides one or two buckets.
--
-- KEYS[i]        bucket i (i = 1, or 1 and 2): a hash with the fields below.
-- KEYS[n+1]      mode 'o' only: the record of the id (a string key)
-- ARGV[3i-2]     bucket i: microseconds per token (a whole number >= 1)
-- ARGV[3i-1]     bucket i: burst, the most tokens the bucket holds
-- ARGV[3i]       bucket i: cost, the tokens this call takes (1 <= cost <= burst)
-- ARGV[3n+1]     the mode, absent for 't': 't' take (AllowOrdered), 'a' take
--                all or nothing (AllowAll: a second-bucket denial charges
--                the first bucket nothing), 'p' peek
--                (what take would decide, with no write: runs as
--                EVALSHA_RO), 'r' refund, 'o' take once (AllowOrderedOnce):
--                a recorded decision is returned marked as a replay;
--                otherwise take, and record the reply when it charged
--                something (an admission, or a second-bucket denial).
-- ARGV[3n+2]     mode 'o' only: the record's expiry in milliseconds
--
-- Every argument is checked before anything is written (the shape before
-- anything is read, each bucket's numbers before its key is read): n is 1
-- or 2, the keys are exactly the buckets (and the record in mode 'o'), each
-- number is a plain decimal integer with per >= 1, burst >= 1,
-- per * burst <= 2^50 (the Spec bound, so every sum below stays an exact
-- Lua number) and 1 <= cost <= burst, and the window is >= 1 ms. Anything
-- else is an ADMITARGS error with nothing written: admit never sends such
-- arguments, but any user allowed EVALSHA can.
--
-- So a take, the call nearly every decision makes, sends 3 arguments a
-- bucket and nothing else: every argument costs the server work. The
-- expiry is computed here, from burst * interval.
--
-- Hash fields (the key schema; README "Key schema (compatibility contract)"):
--   tokens  whole tokens left, a decimal integer in [0, burst]
--   ts      server time in microseconds since the Unix epoch up to which
--           refill has been credited, a decimal integer
--
-- Reply: one string of four decimal integers, "denied retry_us rem1 rem2"
-- (a string, so the client decodes it with one small allocation). denied is
-- 0 when every bucket admitted, else the index of the bucket that refused;
-- retry_us is 0 when admitted, else the exact wait until the refusing bucket
-- holds its cost; remI is the tokens bucket I holds after the call, -1 for a
-- bucket the call did not evaluate. A refund replies "0 0 rem1 rem2". A
-- replay (mode 'o', the id already recorded) replies "R " and the recorded
-- reply. An admission that records nothing (a take or a peek, the call
-- nearly every decision makes) replies with an integer instead, which the
-- server formats itself, far cheaper than string.format: rem1 for one
-- bucket, rem1 * 2^26 + rem2 for two
-- when both are below 2^26 (the sum stays below 2^52, exact), else the
-- string.
--
-- The record (mode 'o') is a string, "<reply>|<request>", where request is
-- this call's arguments, space-separated, then the second key: the same id
-- with another request (bucket count, Spec, Cost, second key) is refused
-- with ADMITREUSE, and a value of any other shape is ADMITCORRUPT; neither
-- writes anything.
--
-- A denied bucket is not rewritten: its refill is a pure function of its
-- stored fields and the server's time, so the next call recomputes the same
-- state. Only its expiry may be lengthened (PEXPIREAT GT), for a Spec made
-- slower since the last write; a no-op PEXPIREAT GT changes nothing and
-- replicates nothing. The one exception is a ts pulled back from the future
-- (a clock step): that is stored, or the freeze would restart each call.
--
-- Bucket 2 is evaluated only when bucket 1 admits. Every hash is read and
-- validated, and every write after the first is checked against the
-- caller's ACL, before the first write, because Valkey does not roll back a
-- script's earlier writes when a later command fails.
--
-- The script runs on every decision, so it is written for the server's
-- time (BENCHMARKS.md, "Server time per script call"), each choice weighed
-- by counting the server's instructions (BenchmarkScriptServerTime under
-- callgrind, in the benchmarks module):
-- every Lua VM instruction and every call into C (find, string.format,
-- redis.acl_check_cmd) costs the server far more than its work. So a take
-- sends only what it needs; every argument and field is parsed once;
-- numbers go to redis.call as numbers where the server formats them
-- cheaply; the two buckets are written out one after the other, not in a
-- loop (a loop's index arithmetic and the copying of its results cost more
-- than the repetition); and the decision's path builds no closure and no
-- table (each costs an allocation and the garbage collector's work). A
-- refusal (a command or the ACL precheck refused) sets ecmd, eerr and ei
-- and breaks out of the one repeat block to the script's end, where its
-- reply is made, instead of calling a function.
--
-- It runs in six steps, numbered below: 1 check the arguments, 2 read
-- (TIME, the record, each bucket: read, validate, refill), 3 decide,
-- 4 check the writes against the ACL, 5 write, 6 reply. Nothing is
-- written before step 5, so every error before it leaves every key as it
-- was. Lines that the mutation tests break carry a marker, "--@name"
-- (internal/mutate); bucket 2's copy of a bucket 1 line carries the same
-- name with a 2.

local argv, keys = ARGV, KEYS
local find = string.find
local na = #argv --@nargs
local n = (na - na % 3) / 3 -- a mode, and a window, follow the buckets' 3 each
local mode = argv[3 * n + 1] -- nil for a take, the usual call
local record
-- The ACL precheck (step 4 and the lease block's lcheck), nil where the
-- server has none (before Valkey 7.2 and Redis 7.0) and in
-- WithoutACLPrecheck's copy of the script, which has nil here.
local acl = redis.acl_check_cmd --@acl

-- Concurrency leases (Limiter.Acquire, Lease.Extend, Lease.Release): a
-- block of their own here, a read (step 2) and a write (step 5) block
-- below for an acquire with buckets.
--
-- KEYS[n+1]      the lease key: a sorted set of holders, each member a
--                holder's name scored by its lease's expiry, in µs on the
--                server's clock (docs/leases.md). n is 0 for a lease
--                alone, or an acquire's 1 or 2 buckets, whose keys and
--                arguments come first as above.
-- ARGV[3n+1]     the mode: 'l' acquire, 'e' extend, 'f' free (release)
-- ARGV[3n+2]     "limit lease_us name": at most limit (1 to 10000) live
--                holders, each lease lasting lease_us (1000 to
--                86400000000) µs, and the holder's name (any bytes, at
--                most 256)
--
-- A holder is live while its score is ahead of the server's clock. An
-- acquire reads and validates every key, then decides the slot first: a
-- live holder of the same name is returned as it is, marked as a replay;
-- limit live holders refuse it, with the wait until the oldest expires.
-- Neither writes anything. Then the buckets decide as mode 'a' decides
-- them, all or nothing: a second-bucket denial leaves the first uncharged. A
-- grant writes the buckets, then prunes every expired holder (at most
-- 10000: the key never holds more), adds this one, and sets the key's
-- expiry to its latest lease's. Extend sets a live lease to now +
-- lease_us (never shorter) and lengthens the key's expiry to match;
-- release removes the holder. Neither prunes.
--
-- Replies: an acquire "denied retry_us rem1 rem2 holders left_us
-- replayed" (denied 3 for the slot, 1 or 2 for a bucket; rem -1 for a
-- bucket not evaluated; holders live after the call), an extend "1
-- left_us" or "0 0" (not live: nothing written), a release "1" (was
-- live), "2" (had expired) or "0" (not held).
local leasing, lkey, lname, llimit, llease, lread, lcheck, lgrant
if mode == 'l' or mode == 'e' or mode == 'f' then --@lease-mode
  lkey = keys[n + 1]
  local a, b
  if na == 3 * n + 2 and #keys == n + 1 and (n == 0 or mode == 'l') then --@lease-shape
    a, b, lname = string.match(argv[na], '^(%d+) (%d+) (.+)$')
  end
  if not lname or #a > 5 or #b > 11 or #lname > 256 then
    return redis.error_reply('ADMITARGS admit: a lease call wants its key after the buckets\' and, after their arguments, ' ..
      'a mode l, e or f and "limit lease_us name"')
  end
  llimit, llease = a + 0, b + 0
  if llimit < 1 or llimit > 10000 or llease < 1000 or llease > 86400000000 then --@lease-range
    return redis.error_reply('ADMITARGS admit: a lease wants 1 <= limit <= 10000 and 1000 <= lease_us <= 86400000000')
  end
  -- A refused lease command: its reply, made once.
  local lerr
  local function lcall(cmd, ...)
    local r = redis.pcall(cmd, lkey, ...)
    if type(r) == 'table' and r.err then
      if lerr then
        return nil
      end
      local e = r.err
      if string.sub(e, 1, 9) == 'WRONGTYPE' then
        lerr = redis.error_reply('WRONGTYPE admit: the lease key holds a value that is not a sorted set')
      elseif find(e, 'ACL', 1, true) or find(e, 'permission', 1, true) or find(e, "can't run", 1, true) or
          find(e, "can't access", 1, true) then
        lerr = redis.error_reply('NOPERM admit: the ACL user may not run ' .. cmd .. ' on the lease key; grant +' ..
          string.lower(cmd) .. ' (docs/leases.md)')
      else
        lerr = redis.error_reply('ADMITREFUSED admit: the server refused ' .. cmd .. ' on the lease key: ' .. e)
      end
      return nil
    end
    return r
  end
  -- A lease alone reads the server's clock here; an acquire with buckets
  -- reads it with theirs (step 2).
  local now
  if n == 0 then
    local t = redis.pcall('TIME')
    if t.err then
      return redis.error_reply('ADMITREFUSED admit: the server refused TIME: ' .. t.err)
    end
    now = t[1] * 1000000 + t[2]
  end
  -- The verdict of a precheck, pcall(acl, cmd, lkey, args...): nil when
  -- the user may run cmd on the lease key, else the call's error reply.
  -- Every precheck comes before the call's first write.
  local function lrefused(cmd, ok, allowed)
    if not ok then
      return redis.error_reply('ADMITREFUSED admit: the server failed the ACL precheck of ' .. cmd ..
        ' on the lease key: ' .. (allowed.err or allowed)) -- a table, or a string (Redis 8.0.2)
    end
    if not allowed then
      return redis.error_reply('NOPERM admit: the ACL user may not run ' .. cmd .. ' on the lease key; grant +' ..
        string.lower(cmd) .. ' (docs/leases.md)')
    end
    return nil
  end
  -- A score as admit writes it: whole µs, at most 16 digits.
  local function whole(s)
    return #s <= 16 and find(s, '^%d+$')
  end
  local corrupt = 'ADMITCORRUPT admit: the lease key holds a sorted set that admit did not write (more than 10000 members, or a score that is not whole µs)'

  -- Extend and release, a lease alone: decided here, whole.
  if n == 0 and mode ~= 'l' then
    local own = lcall('ZSCORE', lname)
    if lerr then
      return lerr
    end
    if own and not whole(own) then
      return redis.error_reply(corrupt)
    end
    if mode == 'f' then
      if not own then
        return '0'
      end
      lcall('ZREM', lname) --@lease-release
      if lerr then
        return lerr
      end
      return own + 0 > now and '1' or '2' --@lease-release-reply
    end
    if not own or own + 0 <= now then --@lease-extend-dead
      return '0 0'
    end
    local exp = math.max(own + 0, now + llease) --@lease-extend-to
    local refused = acl and lrefused('PEXPIREAT', pcall(acl, 'PEXPIREAT', lkey, 0)) --@lease-acl-extend
    if refused then
      return refused
    end
    lcall('ZADD', 'GT', exp, lname) --@lease-extend-add
    if lerr then
      return lerr
    end
    local at = exp / 1000
    redis.call('PEXPIREAT', lkey, at + (-at) % 1, 'GT') --@lease-extend-expire
    return string.format('1 %d', exp - now)
  end

  -- Read and validate the lease key for an acquire at now; return a
  -- reply to return at once (an error, a replay, the slot's refusal), or
  -- nil, then whether any holder has expired and the latest score.
  lread = function(now)
    local own = lcall('ZSCORE', lname) --@lease-zscore
    local card = lcall('ZCARD')
    local top = lcall('ZRANGE', -1, -1, 'WITHSCORES')
    local live = lcall('ZCOUNT', now + 1, '+inf') --@lease-live
    if lerr then
      return lerr
    end
    local latest = top[2]
    if card > 10000 or (own and not whole(own)) or (latest and not whole(latest)) then --@lease-corrupt
      return redis.error_reply(corrupt)
    end
    if own and own + 0 > now then --@lease-replay
      return string.format('0 0 -1 -1 %d %d 1', live, own - now)
    end
    if live >= llimit then --@lease-full
      local oldest = lcall('ZRANGE', now + 1, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
      if lerr then
        return lerr
      end
      if not whole(oldest[2]) then
        return redis.error_reply(corrupt)
      end
      return string.format('3 %d -1 -1 %d 0 0', oldest[2] - now, live) --@lease-full-reply
    end
    return nil, card > live, latest and latest + 0 or 0, live
  end

  -- Check a grant's writes against the ACL (see step 4): every write
  -- after the call's first. first is true when no write of the call comes
  -- before the lease's: its first write then runs under pcall and fails
  -- whole. Return an error reply, or nil.
  lcheck = function(expired, first)
    if not acl then --@lease-acl
      return nil
    end
    local refused
    if not first or expired then
      refused = lrefused('ZADD', pcall(acl, 'ZADD', lkey, 0, lname))
    end
    if not refused and not first and expired then
      refused = lrefused('ZREMRANGEBYSCORE', pcall(acl, 'ZREMRANGEBYSCORE', lkey, '-inf', 0))
    end
    if not refused then
      refused = lrefused('PEXPIREAT', pcall(acl, 'PEXPIREAT', lkey, 0)) --@lease-acl-expire
    end
    return refused
  end

  -- Make a grant's writes at now: prune (when a holder has expired), add
  -- this holder, expire the key at the latest lease's end. Return an
  -- error reply, or nil and the holders live after the grant.
  lgrant = function(now, expired, latest, live, first)
    local exp = now + llease
    local pruned -- the prune's count, once it has run
    if expired then
      pruned = lcall('ZREMRANGEBYSCORE', '-inf', now) --@lease-prune
    end
    if not lerr then
      lcall('ZADD', exp, lname) --@lease-add
    end
    if lerr then
      if first and not pruned then
        return lerr
      end
      -- only without the precheck (lcheck): a write refused after the
      -- buckets' or the prune's, which stays
      return redis.error_reply('ADMITPARTIAL admit: the server refused a write on the lease key after an earlier ' ..
        'write of the call, which stays')
    end
    local at = math.max(exp, latest) / 1000
    redis.call('PEXPIREAT', lkey, at + (-at) % 1) --@lease-expire
    return nil, live + 1
  end

  -- An acquire of a lease alone: decided here, whole.
  if n == 0 then
    local r, expired, latest, live = lread(now)
    if r then
      return r
    end
    r = lcheck(expired, true)
    if r then
      return r
    end
    r, live = lgrant(now, expired, latest, live, true)
    if r then
      return r
    end
    return string.format('0 0 -1 -1 %d %d 0', live, llease)
  end
  -- An acquire with buckets: the steps below, its buckets decided as
  -- mode 'a' decides them, all or nothing.
  leasing, mode = true, 'a' --@lease-all
end

-- 1. Check the arguments' shape, before anything is read (see the
-- header); the buckets' numbers are checked where step 2 parses them.
if n ~= 1 and n ~= 2 then
  return redis.error_reply('ADMITARGS admit: want the arguments of 1 or 2 buckets, got ' .. na .. ' arguments')
end
if not mode then
  -- a take with no mode: na is 3 * n, as n is na / 3 rounded down
  if #keys ~= n then --@argv-shape-take
    return redis.error_reply('ADMITARGS admit: want ' .. n .. ' bucket keys and mode t, a, p, r or o')
  end
elseif leasing then --@lease-args
  -- an acquire with buckets: its shape was checked above
elseif mode == 'o' then
  record = keys[n + 1]
  local w = argv[na]
  if na ~= 3 * n + 2 or #keys ~= n + 1 or not find(w, '^%d+$') or #w > 15 or w + 0 < 1 then --@argv-window
    return redis.error_reply('ADMITARGS admit: mode o wants ' .. n ..
      ' bucket keys and a record key, then a window of whole ms >= 1')
  end
elseif na ~= 3 * n + 1 or #keys ~= n or not (mode == 't' or mode == 'a' or mode == 'p' or mode == 'r') then --@argv-shape
  return redis.error_reply('ADMITARGS admit: want ' .. n .. ' bucket keys and mode t, a, p, r or o')
end

-- A refusal: ecmd is the command the server (eerr, its error) or the ACL
-- precheck (eerr nil; eok false and eallow the error when the check itself
-- failed) refused, ei the bucket (nil for TIME and the record), after set
-- when bucket 1 was written before it. Each one breaks out of this block
-- to the end of the script.
local ecmd, eerr, ei, after, eok, eallow
repeat
  -- 2. Read. TIME once: the one clock of the decision.
  local t = redis.pcall('TIME')
  if t.err then
    -- miniredis, say, refuses TIME in a read-only script: not an ACL refusal
    ecmd, eerr = 'TIME', t.err
    break
  end
  local now = t[1] * 1000000 + t[2] --@now

  -- A decision already recorded under this id is returned as it was made,
  -- marked as a replay, and nothing is taken; provided it was made for this
  -- very request (fp: the arguments, then the second key).
  local fp
  if record then
    fp = argv[1] .. ' ' .. argv[2] .. ' ' .. argv[3]
    if n == 2 then
      fp = fp .. ' ' .. argv[4] .. ' ' .. argv[5] .. ' ' .. argv[6] .. ' ' .. keys[2]
    end
    local r = redis.pcall('GET', record)
    if type(r) == 'table' and r.err then
      ecmd, eerr = 'GET', r.err
      break
    end
    if r then --@record-found
      local bar = find(r, '|', 1, true)
      if not bar or not find(r, '^[012] %d+ %d+ %-?%d+|%d+ %d+ %d+') then --@record-shape
        return redis.error_reply('ADMITCORRUPT admit: the once-record key holds a value that admit did not write')
      end
      if string.sub(r, bar + 1) ~= fp then --@record-reuse
        return redis.error_reply('ADMITREUSE admit: this id was recorded for a different request')
      end
      return 'R ' .. string.sub(r, 1, bar - 1) --@replay
    end
  end

  -- Read, validate and refill bucket 1, then bucket 2: the same lines
  -- with a 2 for a 1. Bucket i has max tokens at most and gains one every
  -- per µs; c is what the call takes (most often "1", compared rather
  -- than parsed). per, max and c are checked here, as plain decimal
  -- integers (so that "nan", "0x10" or " 5" never reach arithmetic)
  -- within the Spec's bounds: per * max <= 2^50 keeps every sum below
  -- 2^53, the largest range in which Lua numbers are exact.
  --
  -- A field is valid as the schema stores it: a decimal integer of at most
  -- 16 digits below 2^53. Neither field present is a new bucket, which is
  -- full, unless the key holds a hash of someone else's (HSET user:42 name
  -- alice), which must not gain our fields and an expiry.
  --
  -- Refill credits whole tokens earned since ts. The remainder of a partial
  -- token stays in ts, so refill never drifts. A server clock that stepped
  -- back grants nothing for the gap, but a ts in the future is pulled back to
  -- now + (max - 1) * per, so the freeze never outlasts one full refill: an
  -- empty bucket's next token comes at most max * per from now, whatever ts
  -- a lagging node or a bad write left. x % 1 is x's fraction: x - x % 1 is
  -- math.floor(x), x + (-x) % 1 is math.ceil(x), without a function call.
  local per1, max1, c1 = argv[1], argv[2], argv[3]
  if not (find(per1, '^%d+$') and find(max1, '^%d+$') and (c1 == '1' or find(c1, '^%d+$'))) then --@argv-digits
    return redis.error_reply('ADMITARGS admit: bucket 1: per, burst and cost must be decimal integers')
  end
  per1, max1 = per1 + 0, max1 + 0 -- s + 0 parses a checked string, cheaper than tonumber
  c1 = c1 == '1' and 1 or c1 + 0 -- the usual cost: a comparison, no parse
  if per1 < 1 or max1 < 1 or per1 * max1 > 2 ^ 50 or c1 < 1 or c1 > max1 then --@argv-range
    return redis.error_reply('ADMITARGS admit: bucket 1: want per >= 1, burst >= 1, per * burst <= 2^50 and 1 <= cost <= burst')
  end
  local v = redis.pcall('HMGET', keys[1], 'tokens', 'ts') --@hmget
  if v.err then
    ecmd, eerr, ei = 'HMGET', v.err, 1 --@hmget-err
    break
  end
  local tk1, ts1, new1, pulled1 = v[1], v[2] -- new1, pulled1: nil, false
  if tk1 and ts1 then
    if #tk1 > 16 or #ts1 > 16 or not (find(tk1, '^%d+$') and find(ts1, '^%d+$')) then --@field-digits
      return redis.error_reply('ADMITCORRUPT admit: bucket 1 hash fields tokens and ts must both be decimal integers')
    end
    tk1, ts1 = tk1 + 0, ts1 + 0 --@fields-parse
    if tk1 >= 2 ^ 53 or ts1 >= 2 ^ 53 then --@field-range
      return redis.error_reply('ADMITCORRUPT admit: bucket 1 hash fields tokens and ts must both be decimal integers')
    end
    if tk1 > max1 then --@cap
      tk1 = max1
    end
    local latest = now + (max1 - 1) * per1 --@latest
    if ts1 > latest then --@freeze
      ts1, pulled1 = latest, true --@pulled
    end
    if now > ts1 then --@refill
      local q = (now - ts1) / per1
      local gained = q - q % 1 -- floor(q)
      if gained * per1 > now - ts1 then
        gained = gained - 1
      end
      if tk1 + gained >= max1 then
        tk1, ts1 = max1, now
      else
        tk1, ts1 = tk1 + gained, ts1 + gained * per1 --@refill-partial
      end
    end
  elseif tk1 or ts1 then
    return redis.error_reply('ADMITCORRUPT admit: bucket 1 hash fields tokens and ts must both be decimal integers')
  else
    local e = redis.pcall('EXISTS', keys[1])
    if e ~= 0 and e ~= 1 then -- an error reply, a table
      ecmd, eerr, ei = 'EXISTS', e.err, 1
      break
    end
    if e == 1 then --@foreign
      return redis.error_reply('ADMITCORRUPT admit: bucket 1 key holds a hash without the fields tokens and ts: it is not a bucket')
    end
    tk1, ts1, new1 = max1, now, true --@fresh
  end

  local tk2, ts2, new2, pulled2, per2, max2, c2
  if n == 2 then
    per2, max2, c2 = argv[4], argv[5], argv[6]
    if not (find(per2, '^%d+$') and find(max2, '^%d+$') and (c2 == '1' or find(c2, '^%d+$'))) then --@argv-digits2
      return redis.error_reply('ADMITARGS admit: bucket 2: per, burst and cost must be decimal integers')
    end
    per2, max2 = per2 + 0, max2 + 0
    c2 = c2 == '1' and 1 or c2 + 0
    if per2 < 1 or max2 < 1 or per2 * max2 > 2 ^ 50 or c2 < 1 or c2 > max2 then --@argv-range2
      return redis.error_reply('ADMITARGS admit: bucket 2: want per >= 1, burst >= 1, per * burst <= 2^50 and 1 <= cost <= burst')
    end
    v = redis.pcall('HMGET', keys[2], 'tokens', 'ts') --@hmget2
    if v.err then
      ecmd, eerr, ei = 'HMGET', v.err, 2 --@hmget-err2
      break
    end
    tk2, ts2 = v[1], v[2]
    if tk2 and ts2 then
      if #tk2 > 16 or #ts2 > 16 or not (find(tk2, '^%d+$') and find(ts2, '^%d+$')) then --@field-digits2
        return redis.error_reply('ADMITCORRUPT admit: bucket 2 hash fields tokens and ts must both be decimal integers')
      end
      tk2, ts2 = tk2 + 0, ts2 + 0 --@fields-parse2
      if tk2 >= 2 ^ 53 or ts2 >= 2 ^ 53 then --@field-range2
        return redis.error_reply('ADMITCORRUPT admit: bucket 2 hash fields tokens and ts must both be decimal integers')
      end
      if tk2 > max2 then --@cap2
        tk2 = max2
      end
      local latest = now + (max2 - 1) * per2 --@latest2
      if ts2 > latest then --@freeze2
        ts2, pulled2 = latest, true --@pulled2
      end
      if now > ts2 then --@refill2
        local q = (now - ts2) / per2
        local gained = q - q % 1
        if gained * per2 > now - ts2 then
          gained = gained - 1
        end
        if tk2 + gained >= max2 then
          tk2, ts2 = max2, now
        else
          tk2, ts2 = tk2 + gained, ts2 + gained * per2 --@refill-partial2
        end
      end
    elseif tk2 or ts2 then
      return redis.error_reply('ADMITCORRUPT admit: bucket 2 hash fields tokens and ts must both be decimal integers')
    else
      local e = redis.pcall('EXISTS', keys[2])
      if e ~= 0 and e ~= 1 then
        ecmd, eerr, ei = 'EXISTS', e.err, 2
        break
      end
      if e == 1 then --@foreign2
        return redis.error_reply('ADMITCORRUPT admit: bucket 2 key holds a hash without the fields tokens and ts: it is not a bucket')
      end
      tk2, ts2, new2 = max2, now, true --@fresh2
    end
  end

  -- An acquire's lease key, read and validated after the buckets (the
  -- lease block above): a replay, or the slot's refusal, returns here with
  -- nothing written.
  local lexpired, llatest, llive
  if leasing then
    local r
    r, lexpired, llatest, llive = lread(now)
    if r then
      return r
    end
  end

  -- 3. Decide, and plan each bucket's write: STORE its fields and expiry
  -- (HSET and PEXPIREAT), KEEP a denied bucket as it is but for its expiry
  -- (PEXPIREAT GT), or nil, nothing; and make the reply. Bucket 2 is
  -- evaluated only when bucket 1 admits.
  local STORE, KEEP = 1, 2
  local how1, how2, reply
  if mode == 'r' then
    -- A refund gives each bucket its cost back, capped at burst. A missing
    -- key is a full bucket already: it is not created.
    tk1 = math.min(max1, tk1 + c1) --@refund1
    how1 = not new1 and STORE or nil --@refund1-how
    if n == 2 then
      tk2 = math.min(max2, tk2 + c2) --@refund2
      how2 = not new2 and STORE or nil --@refund2-how
      reply = string.format('0 0 %d %d', tk1, tk2)
    else
      reply = string.format('0 0 %d -1', tk1)
    end
  elseif tk1 < c1 then --@deny1-test
    how1 = pulled1 and STORE or KEEP --@deny1
    reply = string.format('1 %d %d -1', ts1 + (c1 - tk1) * per1 - now, tk1) --@deny1-reply
    -- charged nothing: not recorded, so the id decides again
    record = nil --@deny1-unrecorded
  elseif n == 2 and tk2 < c2 and mode == 'a' then --@all-deny2-test
    -- all or nothing: bucket 1 admitted but is not charged; both are left
    -- as a denial leaves a bucket
    how1, how2 = pulled1 and STORE or KEEP, pulled2 and STORE or KEEP --@all-deny2
    reply = string.format('2 %d %d %d', ts2 + (c2 - tk2) * per2 - now, tk1, tk2) --@all-deny2-reply
  elseif n == 2 and tk2 < c2 then --@deny2-test
    tk1 = tk1 - c1 --@deny2-charge
    how1, how2 = STORE, pulled2 and STORE or KEEP --@deny2
    reply = string.format('2 %d %d %d', ts2 + (c2 - tk2) * per2 - now, tk1, tk2) --@deny2-reply
  elseif n == 2 then
    tk1, tk2 = tk1 - c1, tk2 - c2 --@both-charge
    how1, how2 = STORE, STORE
    local r1, r2 = tk1, tk2 --@both-reply
    if record or r1 >= 2 ^ 26 or r2 >= 2 ^ 26 then --@both-pack-bound
      reply = string.format('0 0 %d %d', r1, r2)
    else -- both counts in one integer (the header)
      reply = r1 * 2 ^ 26 + r2 --@both-pack
    end
  else
    tk1 = tk1 - c1
    how1 = STORE
    reply = tk1 --@one-reply
    if record then
      reply = string.format('0 0 %d -1', reply)
    end
  end

  -- An acquire's buckets were decided all or nothing (mode 'a'); after a
  -- grant its lease's writes are checked against the ACL with the
  -- buckets' (step 4).
  local ldenied, lretry
  if leasing then
    ldenied, lretry = 0, 0
    if type(reply) == 'string' then
      ldenied, lretry = string.match(reply, '^(%d) (%d+)')
      ldenied = ldenied + 0
    end
    if ldenied == 0 then
      local e = lcheck(lexpired, false) --@lease-check
      if e then
        return e
      end
    end
  end

  if mode ~= 'p' then --@writes
    -- 4. Check the writes against the ACL: when the call writes more than
    -- one command, every write after the first is checked before the first.
    -- A user may read a key and not write it (%R~), or lack HSET or
    -- PEXPIREAT: without the check the script would fail between two writes
    -- and leave a bucket charged, or a key with no expiry. The first write
    -- needs no check: it runs under pcall and succeeds or fails whole, so a
    -- denial's one PEXPIREAT GT needs none at all. redis.acl_check_cmd
    -- exists on Valkey 7.2+ and Redis 7.0+. Its documented form is the
    -- command with all its arguments ("raises an error if the command or its
    -- arguments are invalid"; Redis 8.0.2's security update checks their
    -- count): each check passes the real key and placeholders of a valid
    -- form, and runs under pcall, so that a check the server raises on is
    -- a refusal with nothing written, not a failed script.
    if acl and (how1 == STORE or how2 or record) then
      -- bucket 1's write comes first: of a STORE, its HSET
      if how1 == STORE then
        eok, eallow = pcall(acl, 'PEXPIREAT', keys[1], 0) --@acl-store-expire
        if eallow ~= true then
          ecmd, ei = 'PEXPIREAT', 1
          break
        end
      end
      local first = not how1 -- no write yet
      if how2 == STORE then
        if not first then
          eok, eallow = pcall(acl, 'HSET', keys[2], 'tokens', 0) --@acl-store-hset
          if eallow ~= true then
            ecmd, ei = 'HSET', 2
            break
          end
        end
        eok, eallow = pcall(acl, 'PEXPIREAT', keys[2], 0) --@acl-store-expire2
        if eallow ~= true then
          ecmd, ei = 'PEXPIREAT', 2
          break
        end
        first = false
      elseif how2 == KEEP then
        if not first then
          eok, eallow = pcall(acl, 'PEXPIREAT', keys[2], 0) --@acl-keep-expire
          if eallow ~= true then
            ecmd, ei = 'PEXPIREAT', 2
            break
          end
        end
        first = false
      end
      if record and not first then
        eok, eallow = pcall(acl, 'SET', record, '0') --@acl-record
        if eallow ~= true then
          ecmd = 'SET'
          break
        end
      end
    end
    -- 5. Write, bucket 1 first. STORE's expiry is absolute (PEXPIREAT,
    -- ms on the server's clock, rounded up), so that a denial's expiry and
    -- the last write's compare exactly: the later of now and ts, plus the
    -- time to refill from empty to full, max * per. Never shorter than the
    -- time the bucket needs to be full; when the server clock has stepped
    -- back behind ts, refill resumes only once the clock passes ts again,
    -- hence the later. KEEP makes sure the key outlives the moment the
    -- bucket is full again under this Spec, ts + (max - tk) * per, which
    -- refill leaves unchanged; PEXPIREAT GT only ever lengthens an expiry,
    -- so with an unchanged Spec it is a no-op. A ts pulled back from the
    -- future is stored instead: KEEP would restart the freeze each call.
    --
    -- Numbers go to redis.call as they are where the server writes a whole
    -- number with its integer formatter (Valkey, Redis 7.2+): a fraction of
    -- what string.format costs. Older servers format every number argument
    -- with %.17g, which costs more than string.format('%d') does here. Both
    -- write the same bytes, a plain decimal integer. The reply is made:
    -- tk1 and tk2 may become strings here.
    local plain = (redis.REDIS_VERSION_NUM or 0) >= 0x070200 -- 7.2.0
    if how1 == STORE then --@write-store
      local at, ttl = ts1 / 1000, max1 * per1 / 1000
      if now > ts1 then --@store-later
        at = now / 1000
      end
      at = (at + (-at) % 1) + (ttl + (-ttl) % 1) -- ceil(at) + ceil(ttl) --@store-at
      if not plain then
        tk1, ts1, at = string.format('%d', tk1), string.format('%d', ts1), string.format('%d', at)
      end
      local r = redis.pcall('HSET', keys[1], 'tokens', tk1, 'ts', ts1)
      if r ~= 0 and r ~= 2 and r ~= 1 then -- an error reply, a table
        ecmd, eerr, ei = 'HSET', r.err, 1 --@store-refused
        break
      end
      redis.call('PEXPIREAT', keys[1], at) --@store-expire
    elseif how1 == KEEP then
      local full = (ts1 + (max1 - tk1) * per1) / 1000
      full = full + (-full) % 1 -- ceil(full)
      if not plain then
        full = string.format('%d', full)
      end
      local r = redis.pcall('PEXPIREAT', keys[1], full, 'GT') --@keep-expire
      if r ~= 0 and r ~= 1 then
        ecmd, eerr, ei = 'PEXPIREAT', r.err, 1 --@keep-refused
        break
      end
    end
    if how2 == STORE then --@write-store2
      local at, ttl = ts2 / 1000, max2 * per2 / 1000
      if now > ts2 then --@store-later2
        at = now / 1000
      end
      at = (at + (-at) % 1) + (ttl + (-ttl) % 1) --@store-at2
      if not plain then
        tk2, ts2, at = string.format('%d', tk2), string.format('%d', ts2), string.format('%d', at)
      end
      local r = redis.pcall('HSET', keys[2], 'tokens', tk2, 'ts', ts2)
      if r ~= 0 and r ~= 2 and r ~= 1 then
        after = how1
        ecmd, eerr, ei = 'HSET', r.err, 2 --@store-refused2
        break
      end
      redis.call('PEXPIREAT', keys[2], at) --@store-expire2
    elseif how2 == KEEP then
      local full = (ts2 + (max2 - tk2) * per2) / 1000
      full = full + (-full) % 1
      if not plain then
        full = string.format('%d', full)
      end
      local r = redis.pcall('PEXPIREAT', keys[2], full, 'GT') --@keep-expire2
      if r ~= 0 and r ~= 1 then
        after = how1
        ecmd, eerr, ei = 'PEXPIREAT', r.err, 2 --@keep-refused2
        break
      end
    end
  end

  -- An acquire's reply; a grant's lease writes, after the buckets'.
  if leasing then
    if ldenied ~= 0 then
      return string.format('%d %s %d %d %d 0 0', ldenied, lretry, tk1, ldenied == 2 and tk2 or -1, llive) --@lease-deny-reply
    end
    local e, holders = lgrant(now, lexpired, llatest, llive, false)
    if e then
      return e
    end
    return string.format('0 0 %d %d %d %d 0', tk1, n == 2 and tk2 or -1, holders, llease) --@lease-grant-reply
  end

  -- 6. Reply, and record it when the call charged something (mode 'o').
  if record then
    redis.call('SET', record, reply .. '|' .. fp, 'PX', argv[na]) --@record-write
  end
  return reply --@reply-return
until true

-- A refusal's reply. One that came after bucket 1's write is
-- ADMITPARTIAL: that write stays. The ACL precheck makes it unreachable;
-- only a copy of the script without it (WithoutACLPrecheck) gets there.
if after then
  return redis.error_reply('ADMITPARTIAL admit: the server refused ' .. ecmd .. " on bucket 2's key (" .. eerr ..
    ') after bucket 1 was written, which stays')
end
-- Otherwise nothing has been written: every reply below says so, with
-- ADMITREFUSED (the server's text after it) where the refusal is not one
-- of admit's own codes. An ACL refusal (Valkey and Redis word it
-- differently, and Redis 7.0's messages, "can't run" for a command and
-- "can't access" for a key, name neither) becomes NOPERM naming the
-- command.
local where = ei and (' on bucket ' .. ei .. "'s key") or (ecmd == 'TIME' and '' or ' on the once-record key')
if eok == false then --@precheck-failed
  return redis.error_reply('ADMITREFUSED admit: the server failed the ACL precheck of ' .. ecmd .. where .. ': ' ..
    (eallow.err or eallow)) -- a table, or a string (Redis 8.0.2)
end
if eerr and string.sub(eerr, 1, 9) == 'WRONGTYPE' then
  if not ei then
    return redis.error_reply('WRONGTYPE admit: the once-record key holds a value that is not a string')
  end
  return redis.error_reply('WRONGTYPE admit: bucket ' .. ei .. ' key holds a value that is not a hash')
end
if eerr and not (string.find(eerr, 'ACL', 1, true) or string.find(eerr, 'permission', 1, true) or --@acl-words
    string.find(eerr, "can't run", 1, true) or string.find(eerr, "can't access", 1, true)) then
  return redis.error_reply('ADMITREFUSED admit: the server refused ' .. ecmd .. where .. ': ' .. eerr)
end
return redis.error_reply('NOPERM admit: the ACL user may not run ' .. ecmd ..
  (ei and where or '') .. '; grant +' .. string.lower(ecmd) .. ' (README, "Least-privilege ACL")')
