-- admit: ordered token-bucket admission. One call decides one or two buckets.
--
-- KEYS[i]        bucket i (i = 1, or 1 and 2): a hash with the fields below.
-- KEYS[n+1]      mode 'o' only: the record of the id (a string key)
-- ARGV[3i-2]     bucket i: microseconds per token (a whole number >= 1)
-- ARGV[3i-1]     bucket i: burst, the most tokens the bucket holds
-- ARGV[3i]       bucket i: cost, the tokens this call takes (1 <= cost <= burst)
-- ARGV[3n+1]     the mode, absent for 't': 't' take (AllowOrdered), 'p' peek
--                (what take would decide, with no write: runs as
--                EVALSHA_RO), 'r' refund, 'o' take once (AllowOrderedOnce):
--                a recorded decision is returned marked as a replay;
--                otherwise take, and record the reply when it charged
--                something (an admission, or a second-bucket denial).
-- ARGV[3n+2]     mode 'o' only: the record's expiry in milliseconds
--
-- Every argument is checked before anything is read or written: n is 1 or
-- 2, the keys are exactly the buckets (and the record in mode 'o'), each
-- number is a plain decimal integer with per >= 1, burst >= 1,
-- per * burst <= 2^50 (the Spec bound, so every sum below stays an exact
-- Lua number) and 1 <= cost <= burst, and the window is >= 1 ms. Anything
-- else is an ADMITARGS error with nothing written: admit never sends such
-- arguments, but any user allowed EVALSHA can.
--
-- So a take, the call nearly every decision makes, sends 3 arguments a
-- bucket and nothing else: every argument costs the server about 1,200
-- instructions. The expiry is computed here, from burst * interval.
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
-- reply.
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
-- time (BENCHMARKS.md, "Server time per decision"): a take sends only what
-- it needs, every argument and field is parsed once, numbers go to
-- redis.call as numbers where the server formats them cheaply, and the
-- decision's path builds no closure and no table (each costs an allocation
-- and the garbage collector's work): one function, refusal, serves every
-- error; the others are inline.
--
-- It runs in six steps, numbered below: 1 check the arguments, 2 read
-- (TIME, the record, each bucket: read, validate, refill), 3 decide,
-- 4 check the writes against the ACL, 5 write, 6 reply. Nothing is
-- written before step 5, so every error before it leaves every key as it
-- was. Lines that the mutation tests break carry a marker, "--@name"
-- (internal/mutate).

-- Constants, folded by the compiler: each costs nothing at run time.
local EXACT = 2 ^ 53        -- Lua numbers are exact integers below it
local MAX_REFILL = 2 ^ 50   -- per * burst, the Spec bound: sums stay below EXACT
local V7_2_0 = 0x070200     -- redis.REDIS_VERSION_NUM of 7.2.0
local CORRUPT = ' hash fields tokens and ts must both be decimal integers'

local argv, keys = ARGV, KEYS
local find = string.find
local na = #argv --@nargs
local n = (na - na % 3) / 3 -- a mode, and a window, follow the buckets' 3 each
local mode = argv[3 * n + 1] or 't'
local record

-- 1. Check the arguments' shape, before anything is read (see the
-- header); the buckets' numbers are checked where step 2 parses them.
if n ~= 1 and n ~= 2 then
  return redis.error_reply('ADMITARGS admit: want the arguments of 1 or 2 buckets, got ' .. na .. ' arguments')
end
if mode == 'o' then
  record = keys[n + 1]
  local w = argv[na]
  if na ~= 3 * n + 2 or #keys ~= n + 1 or not find(w, '^%d+$') or #w > 15 or w + 0 < 1 then --@argv-window
    return redis.error_reply('ADMITARGS admit: mode o wants ' .. n ..
      ' bucket keys and a record key, then a window of whole ms >= 1')
  end
elseif na ~= 3 * n + (argv[3 * n + 1] and 1 or 0) or #keys ~= n or --@argv-shape
    not (mode == 't' or mode == 'p' or mode == 'r') then
  return redis.error_reply('ADMITARGS admit: want ' .. n .. ' bucket keys and mode t, p, r or o')
end

-- refusal turns what the server refused into the script's error reply:
-- err is the refused command's error, or nil when the ACL precheck
-- refused cmd; i is the bucket, or nil. An ACL refusal (Valkey and Redis
-- word it differently, and Redis 7.0's messages, "can't run" for a command
-- and "can't access" for a key, name neither) becomes NOPERM naming the
-- command. Nothing has been written.
local function refusal(err, cmd, i)
  if err and string.sub(err, 1, 9) == 'WRONGTYPE' then
    if not i then
      return redis.error_reply('WRONGTYPE admit: the once-record key holds a value that is not a string')
    end
    return redis.error_reply('WRONGTYPE admit: bucket ' .. i .. ' key holds a value that is not a hash')
  end
  if err and not (string.find(err, 'ACL', 1, true) or string.find(err, 'permission', 1, true) or --@acl-words
      string.find(err, "can't run", 1, true) or string.find(err, "can't access", 1, true)) then
    return redis.error_reply(err)
  end
  return redis.error_reply('NOPERM admit: the ACL user may not run ' .. cmd ..
    (i and (' on bucket ' .. i .. "'s key") or '') .. '; grant +' .. string.lower(cmd) ..
    ' (README, "Least-privilege ACL")')
end

-- 2. Read. TIME once: the one clock of the decision.
local t = redis.pcall('TIME')
if t.err then
  -- miniredis, say, refuses TIME in a read-only script: not an ACL refusal
  return refusal(t.err, 'TIME')
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
    return refusal(r.err, 'GET')
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

-- Read, validate and refill every bucket. Bucket i has max tokens at most
-- and gains one every per µs; c is what the call takes (most often "1",
-- compared rather than parsed). per, max and c are checked here, as
-- plain decimal integers (so that "nan", "0x10" or " 5" never reach
-- arithmetic) within the Spec's bounds.
--
-- A field is valid as the schema stores it: a decimal integer of at most
-- 16 digits below 2^53, the largest range in which Lua numbers are exact.
-- Neither field present is a new bucket, which is full, unless the key
-- holds a hash of someone else's (HSET user:42 name alice), which must not
-- gain our fields and an expiry.
--
-- Refill credits whole tokens earned since ts. The remainder of a partial
-- token stays in ts, so refill never drifts. A server clock that stepped
-- back grants nothing for the gap, but a ts in the future is pulled back to
-- now + (max - 1) * per, so the freeze never outlasts one full refill: an
-- empty bucket's next token comes at most max * per from now, whatever ts
-- a lagging node or a bad write left. x % 1 is x's fraction: x - x % 1 is
-- math.floor(x), x + (-x) % 1 is math.ceil(x), without a function call.
local tk1, ts1, new1, pulled1, per1, max1, c1
local tk2, ts2, new2, pulled2, per2, max2, c2
for i = 1, n do
  local per, max, c = argv[3 * i - 2], argv[3 * i - 1], argv[3 * i]
  if not (find(per, '^%d+$') and find(max, '^%d+$') and (c == '1' or find(c, '^%d+$'))) then --@argv-digits
    return redis.error_reply('ADMITARGS admit: bucket ' .. i .. ': per, burst and cost must be decimal integers')
  end
  per, max = per + 0, max + 0 -- s + 0 parses a checked string, cheaper than tonumber
  c = c == '1' and 1 or c + 0 -- the usual cost: a comparison, no parse
  if per < 1 or max < 1 or per * max > MAX_REFILL or c < 1 or c > max then --@argv-range
    return redis.error_reply('ADMITARGS admit: bucket ' .. i ..
      ': want per >= 1, burst >= 1, per * burst <= 2^50 and 1 <= cost <= burst')
  end
  local v = redis.pcall('HMGET', keys[i], 'tokens', 'ts') --@hmget
  if v.err then
    return refusal(v.err, 'HMGET', i) --@hmget-err
  end
  local tk, ts = v[1], v[2]
  local new, pulled = false, false
  if tk and ts then
    if #tk > 16 or #ts > 16 or not (find(tk, '^%d+$') and find(ts, '^%d+$')) then --@field-digits
      return redis.error_reply('ADMITCORRUPT admit: bucket ' .. i .. CORRUPT)
    end
    tk, ts = tk + 0, ts + 0 --@fields-parse
    if tk >= EXACT or ts >= EXACT then --@field-range
      return redis.error_reply('ADMITCORRUPT admit: bucket ' .. i .. CORRUPT)
    end
    if tk > max then --@cap
      tk = max
    end
    local latest = now + (max - 1) * per --@latest
    if ts > latest then --@freeze
      ts, pulled = latest, true --@pulled
    end
    if now > ts then --@refill
      local q = (now - ts) / per
      local gained = q - q % 1 -- floor(q)
      if gained * per > now - ts then
        gained = gained - 1
      end
      if tk + gained >= max then
        tk, ts = max, now
      else
        tk, ts = tk + gained, ts + gained * per --@refill-partial
      end
    end
  elseif tk or ts then
    return redis.error_reply('ADMITCORRUPT admit: bucket ' .. i .. CORRUPT)
  else
    local e = redis.pcall('EXISTS', keys[i])
    if type(e) == 'table' then
      return refusal(e.err, 'EXISTS', i)
    end
    if e == 1 then --@foreign
      return redis.error_reply('ADMITCORRUPT admit: bucket ' .. i ..
        ' key holds a hash without the fields tokens and ts: it is not a bucket')
    end
    tk, ts, new = max, now, true --@fresh
  end
  if i == 1 then
    tk1, ts1, new1, pulled1, per1, max1, c1 = tk, ts, new, pulled, per, max, c
  else
    tk2, ts2, new2, pulled2, per2, max2, c2 = tk, ts, new, pulled, per, max, c
  end
end

-- 3. Decide, and plan each bucket's write: STORE its fields and expiry (HSET
-- and PEXPIREAT), KEEP a denied bucket as it is but for its expiry
-- (PEXPIREAT GT), or nil, nothing. The reply is string.format(fmt, x, y,
-- z). Bucket 2 is evaluated only when bucket 1 admits.
local STORE, KEEP = 1, 2
local how1, how2, fmt, x, y, z
if mode == 'r' then
  -- A refund gives each bucket its cost back, capped at burst. A missing
  -- key is a full bucket already: it is not created.
  tk1 = math.min(max1, tk1 + c1) --@refund1
  how1 = not new1 and STORE or nil --@refund1-how
  fmt, x, y = '0 0 %d %d', tk1, -1
  if n == 2 then
    tk2 = math.min(max2, tk2 + c2) --@refund2
    how2 = not new2 and STORE or nil --@refund2-how
    y = tk2
  end
elseif tk1 < c1 then --@deny1-test
  how1 = pulled1 and STORE or KEEP --@deny1
  fmt, x, y = '1 %d %d -1', ts1 + (c1 - tk1) * per1 - now, tk1 --@deny1-reply
  -- charged nothing: not recorded, so the id decides again
  record = nil --@deny1-unrecorded
elseif n == 2 and tk2 < c2 then --@deny2-test
  tk1 = tk1 - c1 --@deny2-charge
  how1, how2 = STORE, pulled2 and STORE or KEEP --@deny2
  fmt, x, y, z = '2 %d %d %d', ts2 + (c2 - tk2) * per2 - now, tk1, tk2 --@deny2-reply
elseif n == 2 then
  tk1, tk2 = tk1 - c1, tk2 - c2 --@both-charge
  how1, how2 = STORE, STORE
  fmt, x, y = '0 0 %d %d', tk1, tk2 --@both-reply
else
  tk1 = tk1 - c1
  how1 = STORE
  fmt, x = '0 0 %d -1', tk1 --@one-reply
end

if mode == 't' or mode == 'o' or mode == 'r' then --@writes
  -- 4. Check the writes against the ACL: when the call writes more than
  -- one command, every write after the first is checked before the first.
  -- A user may read a key and not write it (%R~), or lack HSET or
  -- PEXPIREAT: without the check the script would fail between two writes
  -- and leave a bucket charged, or a key with no expiry. The first write
  -- needs no check: it runs under pcall and succeeds or fails whole, so a
  -- denial's one PEXPIREAT GT needs none at all. redis.acl_check_cmd
  -- exists on Valkey 7.2+ and Redis 7.0+.
  local acl = redis.acl_check_cmd --@acl
  if acl and (how1 == STORE or how2 or record) then
    local first = true
    for i = 1, n do
      local how = how1
      if i == 2 then
        how = how2
      end
      if how == STORE then
        if not first and not acl('HSET', keys[i], 'tokens', '0') then --@acl-store-hset
          return refusal(nil, 'HSET', i)
        end
        first = false
        if not acl('PEXPIREAT', keys[i], '1') then --@acl-store-expire
          return refusal(nil, 'PEXPIREAT', i)
        end
      elseif how == KEEP then
        if not first and not acl('PEXPIREAT', keys[i], '1') then --@acl-keep-expire
          return refusal(nil, 'PEXPIREAT', i)
        end
        first = false
      end
    end
    if record and not first and not acl('SET', record, '0', 'PX', '1') then
      return refusal(nil, 'SET')
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
  -- write the same bytes, a plain decimal integer.
  local plain = (redis.REDIS_VERSION_NUM or 0) >= V7_2_0
  for i = 1, n do
    local how, tk, ts, per, max = how1, tk1, ts1, per1, max1
    if i == 2 then
      how, tk, ts, per, max = how2, tk2, ts2, per2, max2
    end
    if how == STORE then --@write-store
      local at, ttl = ts / 1000, max * per / 1000
      if now > ts then --@store-later
        at = now / 1000
      end
      at = (at + (-at) % 1) + (ttl + (-ttl) % 1) -- ceil(at) + ceil(ttl) --@store-at
      if not plain then
        tk, ts, at = string.format('%d', tk), string.format('%d', ts), string.format('%d', at)
      end
      local r = redis.pcall('HSET', keys[i], 'tokens', tk, 'ts', ts)
      if type(r) == 'table' then
        return refusal(r.err, 'HSET', i) --@store-refused
      end
      redis.call('PEXPIREAT', keys[i], at) --@store-expire
    elseif how == KEEP then
      local full = (ts + (max - tk) * per) / 1000
      full = full + (-full) % 1 -- ceil(full)
      if not plain then
        full = string.format('%d', full)
      end
      local r = redis.pcall('PEXPIREAT', keys[i], full, 'GT') --@keep-expire
      if type(r) == 'table' then
        return refusal(r.err, 'PEXPIREAT', i) --@keep-refused
      end
    end
  end
end

-- 6. Reply, and record it when the call charged something (mode 'o').
local reply = string.format(fmt, x, y, z)
if record then
  redis.call('SET', record, reply .. '|' .. fp, 'PX', argv[na]) --@record-write
end
return reply --@reply-return
