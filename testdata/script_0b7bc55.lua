-- admit: ordered token-bucket admission. One call decides one or two buckets.
--
-- KEYS[i]        bucket i (i = 1, or 1 and 2): a hash with the fields below.
-- ARGV[3i-2]     microseconds per token (a whole number >= 1)
-- ARGV[3i-1]     burst: the most tokens the bucket holds
-- ARGV[3i]       expiry in milliseconds: burst * interval, rounded up
--
-- Hash fields (the key schema; README "Key schema (compatibility contract)"):
--   tokens  whole tokens left, a decimal integer in [0, burst]
--   ts      server time in microseconds since the Unix epoch up to which
--           refill has been credited, a decimal integer
--
-- Reply: {denied, retry_us}, integers only. denied is 0 when every bucket
-- admitted, else the index of the bucket that refused; retry_us is 0 when
-- admitted, else the exact wait until the refusing bucket holds one token.
--
-- Bucket 2 is evaluated only when bucket 1 admits. Every hash is read and
-- validated before the first write, because Valkey does not roll back a
-- script's earlier writes when a later command fails.

local n = #KEYS
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- valid accepts what the schema stores: a decimal integer below 2^53, the
-- largest range in which Lua numbers are exact.
local function valid(v)
  return string.match(v, '^%d+$') ~= nil and #v <= 16 and tonumber(v) < 9007199254740992
end

local tokens, stamps = {}, {}
for i = 1, n do
  local v = redis.pcall('HMGET', KEYS[i], 'tokens', 'ts')
  if v.err then
    return redis.error_reply('WRONGTYPE admit: bucket ' .. i .. ' key holds a value that is not a hash')
  end
  local tk, ts = v[1], v[2]
  if tk or ts then
    if not (tk and ts and valid(tk) and valid(ts)) then
      return redis.error_reply('ADMITCORRUPT admit: bucket ' .. i ..
        ' hash fields tokens and ts must both be decimal integers')
    end
    tokens[i], stamps[i] = tonumber(tk), tonumber(ts)
  end
end

-- refill credits whole tokens earned since ts. A fresh bucket is full. The
-- remainder of a partial token stays in ts, so refill never drifts; ts never
-- moves backwards, so a server clock stepping back grants nothing.
local function refill(i)
  local interval, burst = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1])
  local tk, ts = tokens[i], stamps[i]
  if tk == nil then
    return burst, now
  end
  if tk > burst then
    tk = burst
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

-- store writes a bucket and its expiry. The expiry is never shorter than the
-- time to refill from empty to full; when the server clock has stepped back
-- behind ts, refill resumes only once the clock passes ts again, so the
-- expiry is extended by that gap.
local function store(i, tk, ts)
  redis.call('HSET', KEYS[i], 'tokens', string.format('%d', tk), 'ts', string.format('%d', ts))
  local ttl = ARGV[3 * i]
  if ts > now then
    ttl = string.format('%d', tonumber(ttl) + math.ceil((ts - now) / 1000))
  end
  redis.call('PEXPIRE', KEYS[i], ttl)
end

local tk1, ts1 = refill(1)
if tk1 < 1 then
  store(1, tk1, ts1)
  return {1, ts1 + tonumber(ARGV[1]) - now}
end
if n == 2 then
  local tk2, ts2 = refill(2)
  if tk2 < 1 then
    store(1, tk1 - 1, ts1)
    store(2, tk2, ts2)
    return {2, ts2 + tonumber(ARGV[4]) - now}
  end
  store(2, tk2 - 1, ts2)
end
store(1, tk1 - 1, ts1)
return {0, 0}
