-- Sluice: decide every policy of one subject atomically.
--
-- This is algorithm.go in Lua. Every floating-point operation below is the
-- one algorithm.go performs, in the same order, on the same doubles (Lua
-- numbers are IEEE doubles; times are whole microseconds, exact below 2^53),
-- so the Redis store decides bit for bit as the memory store does. The one
-- exception is q29, which rounds a bucket's stored number with frexp and
-- ldexp where Go's quantDown and quantUp clear bits; every rounding step
-- here is exact, so both give the same double (TestRedisQuantisersAgree).
-- Window counts are kept exactly (stored_count, as Go's storedCount;
-- TestRedisStoredCountAgrees). Change both together; conformance_test.go
-- checks that they agree.
--
-- KEYS[i]   state of policy i; all keys share the subject's hash tag.
-- ARGV[1]   now in Unix microseconds, or "" to read the server's TIME.
--           Only tests set it.
-- ARGV[2]   extra milliseconds added to every TTL (0 in production; tests
--           on virtual time set it, since Redis expires on real time).
-- ARGV[3+6(i-1) ..] per policy: algorithm (1 token bucket, 2 leaky bucket,
--           3 fixed window, 4 sliding window log, 5 sliding window counter),
--           rate or count, burst, window in microseconds, cost, and the
--           scale the rate and burst were multiplied by (for the TTL).
--
-- State is one string per key. It starts with a 7-byte header,
-- struct '<I4I3' of lo = T mod 2^32 and hi = floor(T / 2^32) + alg * 2^21
-- (T < 2^53 µs, the year 2255). Then come, 12 bytes in all:
--   buckets: A, the tokens or level, as the top 5 bytes of its
--     little-endian double: the 29 significant bits q29 rounded it to;
--   fixed window: A, the count, as a 5-byte little-endian unsigned
--     integer (struct '<I5'), exact up to 2^40 - 1;
-- or, 17 bytes in all, for the sliding window counter: A and B, the
-- current and previous counts, as two such integers. The sliding window
-- log has T = 0 and one full 8-byte double per timestamp (7 + 8n bytes),
-- so its timestamps stay exact. A key whose length or algorithm does not
-- match reads as a subject never seen.
--
-- The state is written, with its TTL, only if every policy allows and only
-- for policies with a non-zero cost; or, when some policy rejects, for each
-- token bucket that rejected while full at its burst at a time later than
-- its stored state (keepRejected in algorithm.go: a full bucket spends
-- nothing). Returns five integers per policy:
-- allowed (0/1), limit, remaining, reset-after µs, retry-after µs.

local US = 1000000

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * US + tonumber(t[2])
end
local pad = tonumber(ARGV[2])

local P21, P32 = 2097152, 4294967296

-- q29 rounds x with round (math.floor: towards minus infinity, math.ceil:
-- towards plus infinity) to the doubles whose encoding's low 24 bits are
-- zero, which its top 5 bytes hold exactly: k * 2^(e - 29) for x's
-- frexp exponent e, an integer k and |k| <= 2^29. Below 2^-1022 the
-- exponent stays at that of 2^-1022 (-1021), giving subnormals the fixed
-- quantum 2^-1050 that 5 bytes hold. Both ldexp calls and round are exact.
-- Zero, infinities and NaN come back unchanged (ldexp of them is
-- themselves, whatever e frexp gave).
local function q29(x, round)
  local _, e = math.frexp(x)
  if e < -1021 then e = -1021 end
  return math.ldexp(round(math.ldexp(x, 29 - e)), e - 29)
end

-- q29_up_to mirrors quantUpTo: x rounded up, unless that passes most
-- while rounding down leaves less than a unit below it.
local function q29_up_to(x, most)
  local q = q29(x, math.ceil)
  if q <= most then return q end
  local d = q29(x, math.floor)
  if most - d < 1 then return d end
  return q
end

-- MAX_COUNT is the largest count '<I5' holds, 2^40 - 1.
local MAX_COUNT = 1099511627775

-- stored_count mirrors storedCount: a window count is a whole number from
-- 0 to the Count, at most 1e12 (Validate), so it comes back unchanged and
-- '<I5' holds it exactly. A fraction, which cannot occur, would round up
-- and anything from MAX_COUNT up (or NaN) would be held at MAX_COUNT, as
-- in Go, rather than be truncated or wrapped by struct.pack.
local function stored_count(x)
  if not (x < MAX_COUNT) then return MAX_COUNT end
  if not (x > 0) then return 0 end
  return math.ceil(x)
end

local function ceil_us(v)
  if not (v > 0) then return 0 end
  if v > 1e15 then return 1e15 end
  return math.ceil(v)
end

local function floor_units(v)
  if not (v > 0) then return 0 end
  return math.floor(v)
end

local function token_bucket(st, rate, burst, cost)
  local tokens, t = burst, now
  if st and st[2] ~= 0 then
    tokens, t = st[1], st[2]
    if now > t then
      tokens = tokens + ((now - t) * rate) / US
      t = now
    end
    if tokens > burst then tokens = burst end
  end
  local ok, retry = 0, 0
  if cost <= tokens then
    ok = 1
    tokens = tokens - cost
  else
    retry = ceil_us((cost - tokens) * US / rate)
    for _ = 1, 3 do
      if not (tokens + (retry * rate) / US < cost) then break end
      retry = retry + 1
    end
  end
  return ok, floor_units(burst), floor_units(tokens),
    ceil_us((burst - tokens) * US / rate), retry, {q29(tokens, math.floor), t}
end

local function leaky_bucket(st, rate, burst, cost)
  local level, t = 0, now
  if st and st[2] ~= 0 then
    level, t = st[1], st[2]
    if now > t then
      local l = level - ((now - t) * rate) / US
      if l > 0 then level = l else level = 0 end
      t = now
    end
  end
  local ok, retry = 0, 0
  if level + cost <= burst then
    ok = 1
    level = level + cost
  else
    retry = ceil_us((level + cost - burst) * US / rate)
    for _ = 1, 3 do
      if not ((level - (retry * rate) / US) + cost > burst) then break end
      retry = retry + 1
    end
  end
  return ok, floor_units(burst), floor_units(burst - level),
    ceil_us(level * US / rate), retry, {q29_up_to(level, burst), t}
end

local function fixed_window(st, count, w, cost)
  local start = now - math.fmod(now, w)
  local n, t = 0, 0
  if st then n, t = st[1], st[2] end
  if t == 0 or start > t then n, t = 0, start end
  local fin = t + w
  local ok, retry = 0, 0
  if n + cost <= count then
    ok = 1
    n = n + cost
  elseif cost <= count then
    retry = fin - now
  else
    retry = fin - now + w
  end
  return ok, floor_units(count), floor_units(count - n), fin - now, retry, {stored_count(n), t}
end

local function estimate(cur, prev, w, e)
  return cur + prev * (w - e) / w
end

local function sliding_retry(cur, prev, w, e, limit, cost)
  if cost > limit then return 2 * w - e end
  if cur + cost <= limit then
    local target = ceil_us(w - (limit - cost - cur) * w / prev)
    for _ = 1, 3 do
      if not (target < w and estimate(cur, prev, w, target) + cost > limit) then break end
      target = target + 1
    end
    local r = target - e
    if r < 1 then r = 1 end
    return r
  end
  local target = ceil_us(w - (limit - cost) * w / cur)
  for _ = 1, 3 do
    if not (target < w and estimate(0, cur, w, target) + cost > limit) then break end
    target = target + 1
  end
  return w - e + target
end

local function sliding_counter(st, count, w, cost)
  local start = now - math.fmod(now, w)
  local cur, prev, t = 0, 0, 0
  if st then cur, prev, t = st[1], st[2], st[3] end
  if t == 0 then
    cur, prev, t = 0, 0, start
  elseif start == t + w then
    cur, prev, t = 0, cur, start
  elseif start > t then
    cur, prev, t = 0, 0, start
  end
  local e = now - t
  if e < 0 then e = 0 end
  local est = estimate(cur, prev, w, e)
  local ok, retry, reset = 0, 0, 0
  if est + cost <= count then
    ok = 1
    cur = cur + cost
    est = est + cost
  else
    retry = sliding_retry(cur, prev, w, e, count, cost)
  end
  if cur > 0 then
    reset = t + 2 * w - now
  elseif prev > 0 then
    reset = t + w - now
  end
  return ok, floor_units(count), floor_units(count - est), reset, retry,
    {stored_count(cur), stored_count(prev), t}
end

-- The log's state is its timestamps in order; the returned state is the
-- log as a commit would leave it.
local function sliding_log(log, count, w, cost)
  local drop = 0
  while drop < #log and log[drop + 1] <= now - w do drop = drop + 1 end
  local live = #log - drop
  local n = live
  local capacity = math.floor(count)
  local ok, retry, reset = 0, 0, 0
  if n + cost <= capacity then
    ok = 1
    n = n + cost
  elseif cost > capacity then
    retry = w
  else
    local k = n + cost - capacity
    retry = log[drop + k] + w - now
  end
  if ok == 1 and cost > 0 then
    reset = w
  elseif live > 0 then
    reset = log[#log] + w - now
  end
  local next = {}
  if ok == 1 then
    for i = drop + 1, #log do next[#next + 1] = log[i] end
    for _ = 1, cost do next[#next + 1] = now end
  end
  return ok, capacity, floor_units(capacity - n), reset, retry, next
end

-- q29unpack reads the 5-byte number at position pos of s.
local function q29unpack(s, pos)
  return (struct.unpack('<d', '\0\0\0' .. string.sub(s, pos, pos + 4)))
end

-- q29pack writes x, which q29 has rounded, in 5 bytes.
local function q29pack(x)
  return string.sub(struct.pack('<d', x), 4)
end

local function load(key, alg)
  local s = redis.call('GET', key)
  if s then
    local n = #s
    if (alg == 4 and n >= 7 and (n - 7) % 8 == 0) or (alg == 5 and n == 17) or
      (alg ~= 4 and alg ~= 5 and n == 12) then
      local lo, hi = struct.unpack('<I4I3', s)
      if math.floor(hi / P21) == alg then
        local t = math.fmod(hi, P21) * P32 + lo
        if alg == 4 then
          local log = {}
          for i = 1, (n - 7) / 8 do
            log[i] = struct.unpack('<d', s, 8 * i)
          end
          return log
        end
        if alg == 5 then
          local cur, prev = struct.unpack('<I5I5', s, 8)
          return {cur, prev, t}
        end
        if alg == 3 then return {(struct.unpack('<I5', s, 8)), t} end
        return {q29unpack(s, 8), t}
      end
    end
  end
  if alg == 4 then return {} end
  return nil
end

local function header(alg, t)
  return struct.pack('<I4I3', math.fmod(t, P32), math.floor(t / P32) + alg * P21)
end

local function encode(alg, st)
  if alg == 4 then
    local parts = {header(4, 0)}
    for i = 1, #st do parts[i + 1] = struct.pack('<d', st[i]) end
    return table.concat(parts)
  end
  if alg == 5 then return header(5, st[3]) .. struct.pack('<I5I5', st[1], st[2]) end
  if alg == 3 then return header(3, st[2]) .. struct.pack('<I5', st[1]) end
  return header(alg, st[2]) .. q29pack(st[1])
end

-- ttl mirrors ttl() in algorithm.go: how long the new state matters.
-- A token bucket's TTL uses the unscaled limit (p / f): whatever share
-- the region gets later, the bucket is full by then, so dropping it
-- changes no decision.
local function ttl(alg, st, p1, p2, w, f)
  if alg == 1 then return ceil_us((p2 / f - st[1]) * US / (p1 / f)) + US end
  if alg == 2 then return ceil_us(st[1] * US / p1) + US end
  if alg == 3 then return st[2] + w - now + US end
  if alg == 5 then return st[3] + 2 * w - now + US end
  if #st > 0 then return st[#st] + w - now + US end
  return US
end

local out, states, algs, costs, keep = {}, {}, {}, {}, {}
local all = true
for i = 1, #KEYS do
  local j = 3 + 6 * (i - 1)
  local alg = tonumber(ARGV[j])
  local p1, p2 = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local w, cost = tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4])
  local st = load(KEYS[i], alg)
  local ok, limit, remaining, reset, retry, next
  if alg == 1 then
    ok, limit, remaining, reset, retry, next = token_bucket(st, p1, p2, cost)
  elseif alg == 2 then
    ok, limit, remaining, reset, retry, next = leaky_bucket(st, p1, p2, cost)
  elseif alg == 3 then
    ok, limit, remaining, reset, retry, next = fixed_window(st, p1, w, cost)
  elseif alg == 4 then
    ok, limit, remaining, reset, retry, next = sliding_log(st, p1, w, cost)
  else
    ok, limit, remaining, reset, retry, next = sliding_counter(st, p1, w, cost)
  end
  if ok == 0 then
    all = false
    -- keepRejected: a token bucket full at its burst, newer than stored.
    local old_t = 0
    if st then old_t = st[2] end
    keep[i] = alg == 1 and next[2] ~= old_t and next[1] == q29(p2, math.floor)
  end
  states[i], algs[i], costs[i] = next, alg, cost
  local k = 5 * (i - 1)
  out[k + 1], out[k + 2], out[k + 3], out[k + 4], out[k + 5] = ok, limit, remaining, reset, retry
end

if all then
  for i = 1, #KEYS do
    if costs[i] > 0 then
      local j = 3 + 6 * (i - 1)
      local us = ttl(algs[i], states[i], tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]), tonumber(ARGV[j + 5]))
      redis.call('SET', KEYS[i], encode(algs[i], states[i]), 'PX', math.ceil(us / 1000) + pad)
    end
  end
else
  for i = 1, #KEYS do
    if keep[i] then
      local j = 3 + 6 * (i - 1)
      local us = ttl(1, states[i], tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), 0, tonumber(ARGV[j + 5]))
      redis.call('SET', KEYS[i], encode(1, states[i]), 'PX', math.ceil(us / 1000) + pad)
    end
  end
end
return out
