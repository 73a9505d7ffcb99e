-- admit: ordered token-bucket admission. One call decides one or two buckets.
--
-- KEYS[i]        bucket i (i = 1, or 1 and 2): a hash with the fields below.
-- KEYS[n+1]      mode 'o' only: the record of the id (a string key)
-- ARGV[1]        mode: 't' take (AllowOrdered), 'p' peek (what take would
--                decide, with no write: runs as EVALSHA_RO), 'r' refund,
--                'o' take once (AllowOrderedOnce): a recorded decision is
--                returned as it is; otherwise take, and record the reply
-- ARGV[4n+2]     mode 'o' only: the record's expiry in milliseconds
-- ARGV[4i-2]     bucket i: microseconds per token (a whole number >= 1)
-- ARGV[4i-1]     bucket i: burst, the most tokens the bucket holds
-- ARGV[4i]       bucket i: expiry in milliseconds, burst * interval rounded up
-- ARGV[4i+1]     bucket i: cost, the tokens this call takes (1 <= cost <= burst)
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
-- bucket the call did not evaluate. A refund replies "0 0 rem1 rem2".
--
-- A denied bucket is not rewritten: its refill is a pure function of its
-- stored fields and the server's time, so the next call recomputes the same
-- state. Only its expiry may be lengthened (PEXPIREAT GT), for a Spec made
-- slower since the last write; a no-op PEXPIREAT GT changes nothing and
-- replicates nothing. The one exception is a ts pulled back from the future
-- (a clock step): that is stored, or the freeze would restart each call.
--
-- Bucket 2 is evaluated only when bucket 1 admits. Every hash is read and
-- validated, and every write is checked against the caller's ACL, before the
-- first write, because Valkey does not roll back a script's earlier writes
-- when a later command fails.

local n = #KEYS
local mode = ARGV[1]
local record
if mode == 'o' then
  n = n - 1
  record = KEYS[n + 1]
end

-- noperm names the command the ACL user lacks; nothing has been written.
local function noperm(cmd, i)
  return redis.error_reply('NOPERM admit: the ACL user may not run ' .. cmd ..
    (i and (' on bucket ' .. i .. "'s key") or '') .. '; grant +' .. string.lower(cmd) ..
    ' (README, "Least-privilege ACL")')
end

-- isACL tells an ACL refusal of a command run from the script (Valkey and
-- Redis word it differently) from other errors.
local function isACL(err)
  return string.find(err, 'ACL', 1, true) or string.find(err, 'permission', 1, true) or string.find(err, "can't run", 1, true)
end

-- precheck runs before the first of several writes. A user may read a key
-- and not write it (%R~), or lack HSET or PEXPIREAT: without this check the
-- script would fail between two writes and leave a bucket charged, or a key
-- with no expiry. redis.acl_check_cmd exists on Valkey 7.2+ and Redis 7.0+.
-- The first write needs no check, since it succeeds or fails whole: first
-- names the bucket whose HSET comes first (store(first, ..., true) runs it
-- under pcall), or is nil. A call that writes one command only (a denial's
-- PEXPIREAT GT) needs no precheck at all. A peek writes nothing.
local function precheck(first)
  if not redis.acl_check_cmd then
    return nil
  end
  for i = 1, n do
    if i ~= first and not redis.acl_check_cmd('HSET', KEYS[i], 'tokens', '0', 'ts', '0') then
      return noperm('HSET', i)
    end
    if not redis.acl_check_cmd('PEXPIREAT', KEYS[i], '1') then
      return noperm('PEXPIREAT', i)
    end
  end
  if record and not redis.acl_check_cmd('SET', record, '0', 'PX', '1') then
    return noperm('SET')
  end
  return nil
end

local t = redis.pcall('TIME')
if t.err then
  if isACL(t.err) then
    return noperm('TIME')
  end
  return redis.error_reply(t.err) -- miniredis, say, refuses TIME in a read-only script
end
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- A decision already recorded under this id is returned as it was made,
-- and nothing is taken.
if record then
  local r = redis.pcall('GET', record)
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('WRONGTYPE admit: the once-record key holds a value that is not a string')
    end
    if isACL(r.err) then
      return noperm('GET')
    end
    return redis.error_reply(r.err)
  end
  if r then
    return r
  end
end

-- valid accepts what the schema stores: a decimal integer below 2^53, the
-- largest range in which Lua numbers are exact.
local function valid(v)
  return #v <= 16 and string.find(v, '^%d+$') ~= nil and tonumber(v) < 9007199254740992
end

-- readErr turns a failed read into the script's error: a wrong type, or an
-- ACL refusal (Redis 7.0's message does not name the command, so we do).
local function readErr(err, cmd, i)
  if string.sub(err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('WRONGTYPE admit: bucket ' .. i .. ' key holds a value that is not a hash')
  end
  if isACL(err) then
    return noperm(cmd, i)
  end
  return redis.error_reply(err)
end

local tokens, stamps = {}, {}
for i = 1, n do
  local v = redis.pcall('HMGET', KEYS[i], 'tokens', 'ts')
  if v.err then
    return readErr(v.err, 'HMGET', i)
  end
  local tk, ts = v[1], v[2]
  if tk or ts then
    if not (tk and ts and valid(tk) and valid(ts)) then
      return redis.error_reply('ADMITCORRUPT admit: bucket ' .. i ..
        ' hash fields tokens and ts must both be decimal integers')
    end
    tokens[i], stamps[i] = tonumber(tk), tonumber(ts)
  else
    -- Neither field: a new bucket, unless the key holds a hash of someone
    -- else's (HSET user:42 name alice), which must not gain our fields
    -- and an expiry.
    local e = redis.pcall('EXISTS', KEYS[i])
    if type(e) == 'table' then
      return readErr(e.err, 'EXISTS', i)
    end
    if e == 1 then
      return redis.error_reply('ADMITCORRUPT admit: bucket ' .. i ..
        ' key holds a hash without the fields tokens and ts: it is not a bucket')
    end
  end
end

-- refill credits whole tokens earned since ts. A fresh bucket is full. The
-- remainder of a partial token stays in ts, so refill never drifts. A
-- server clock that stepped back grants nothing for the gap, but a ts in
-- the future is pulled back to now + (burst - 1) * interval, so the freeze
-- never outlasts one full refill: an empty bucket's next token comes at
-- most burst * interval from now, whatever ts a lagging node or a bad
-- write left.
local pulled = {}
local function refill(i)
  local interval, burst = tonumber(ARGV[4 * i - 2]), tonumber(ARGV[4 * i - 1])
  local tk, ts = tokens[i], stamps[i]
  if tk == nil then
    return burst, now
  end
  if tk > burst then
    tk = burst
  end
  local latest = now + (burst - 1) * interval
  if ts > latest then
    ts = latest
    pulled[i] = true
  end
  if now > ts then
    local gained = math.floor((now - ts) / interval)
    if gained * interval > now - ts then
      gained = gained - 1
    end
    if tk + gained >= burst then
      tk, ts = burst, now
    else
      tk, ts = tk + gained, ts + gained * interval
    end
  end
  return tk, ts
end

-- Expiries are absolute (PEXPIREAT, ms on the server's clock, rounded up),
-- so that a denial's expiry and the last write's compare exactly.
--
-- store writes a bucket and its expiry: the later of now and ts, plus the
-- time to refill from empty to full. Never shorter than the time the bucket
-- needs to be full; when the server clock has stepped back behind ts,
-- refill resumes only once the clock passes ts again, hence the later.
-- With first, the HSET is the call's first write and runs under pcall: it
-- returns the error reply of a refusal, before anything was written.
local function store(i, tk, ts, first)
  local tks, tss = string.format('%d', tk), string.format('%d', ts)
  if first then
    local r = redis.pcall('HSET', KEYS[i], 'tokens', tks, 'ts', tss)
    if type(r) == 'table' and r.err then
      if isACL(r.err) then
        return noperm('HSET', i)
      end
      return redis.error_reply(r.err)
    end
  else
    redis.call('HSET', KEYS[i], 'tokens', tks, 'ts', tss)
  end
  redis.call('PEXPIREAT', KEYS[i], string.format('%d', math.ceil(math.max(ts, now) / 1000) + tonumber(ARGV[4 * i])))
  return nil
end

-- lengthen makes sure a denied bucket's key outlives the moment the bucket
-- is full again under this Spec, ts + (burst - tk) * interval, which refill
-- leaves unchanged; PEXPIREAT GT only ever lengthens an expiry, so with an
-- unchanged Spec it is a no-op. It returns the error reply of a refusal.
local function lengthen(i, tk, ts)
  local full = ts + (tonumber(ARGV[4 * i - 1]) - tk) * tonumber(ARGV[4 * i - 2])
  local r = redis.pcall('PEXPIREAT', KEYS[i], string.format('%d', math.ceil(full / 1000)), 'GT')
  if type(r) == 'table' and r.err then
    if isACL(r.err) then
      return noperm('PEXPIREAT', i)
    end
    return redis.error_reply(r.err)
  end
  return nil
end

-- keep leaves a denied bucket's fields as they are and lengthens its
-- expiry; a ts pulled back from the future must be stored instead.
local function keep(i, tk, ts)
  if pulled[i] then
    store(i, tk, ts)
    return nil
  end
  return lengthen(i, tk, ts)
end

-- reply formats the reply and, in mode 'o', records it under the id.
local function reply(denied, retry, rem1, rem2)
  local r = string.format('%d %d %d %d', denied, retry, rem1, rem2)
  if record then
    redis.call('SET', record, r, 'PX', ARGV[4 * n + 2])
  end
  return r
end

-- wait is the time until bucket i, holding tk tokens credited up to ts,
-- holds its cost.
local function wait(i, tk, ts)
  return ts + (tonumber(ARGV[4 * i + 1]) - tk) * tonumber(ARGV[4 * i - 2]) - now
end

local write = mode == 't' or mode == 'o'

-- denyFirst writes the first bucket's denial: one command, which succeeds
-- or fails whole, unless ts was pulled back or a record follows: then the
-- writes are several, and prechecked.
local function denyFirst(tk, ts)
  if pulled[1] or record then
    local e = precheck()
    if e then
      return e
    end
  end
  return keep(1, tk, ts)
end

if mode == 'r' then
  -- A refund gives each bucket its cost back, capped at burst. A missing
  -- key is a full bucket already: it is not created.
  local e = precheck()
  if e then
    return e
  end
  local rem = {-1, -1}
  for i = 1, n do
    local tk, ts = refill(i)
    local burst = tonumber(ARGV[4 * i - 1])
    tk = math.min(burst, tk + tonumber(ARGV[4 * i + 1]))
    if tokens[i] ~= nil then
      store(i, tk, ts)
    end
    rem[i] = tk
  end
  return reply(0, 0, rem[1], rem[2])
end

local c1 = tonumber(ARGV[5])
local tk1, ts1 = refill(1)
if tk1 < c1 then
  if write then
    local e = denyFirst(tk1, ts1)
    if e then
      return e
    end
  end
  return reply(1, wait(1, tk1, ts1), tk1, -1)
end
if n == 2 then
  local c2 = tonumber(ARGV[9])
  local tk2, ts2 = refill(2)
  if tk2 < c2 then
    if write then
      local e = precheck(1) or store(1, tk1 - c1, ts1, true) or keep(2, tk2, ts2)
      if e then
        return e
      end
    end
    return reply(2, wait(2, tk2, ts2), tk1 - c1, tk2)
  end
  if write then
    local e = precheck(2) or store(2, tk2 - c2, ts2, true)
    if e then
      return e
    end
    store(1, tk1 - c1, ts1)
  end
  return reply(0, 0, tk1 - c1, tk2 - c2)
end
if write then
  local e = precheck(1) or store(1, tk1 - c1, ts1, true)
  if e then
    return e
  end
end
return reply(0, 0, tk1 - c1, -1)
