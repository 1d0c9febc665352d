-- Sluice: decide every policy of one subject atomically.
--
-- This is algorithm.go in Lua. Every floating-point operation below is the
-- one algorithm.go performs, in the same order, on the same doubles (Lua
-- numbers are IEEE doubles; times are whole microseconds, exact below 2^53),
-- so the Redis store decides bit for bit as the memory store does. The one
-- exception is q29, which rounds a bucket's stored number with frexp and
-- ldexp where Go's quant.Down and quant.Up clear bits; every rounding step
-- here is exact, so both give the same double (TestRedisQuantisersAgree).
-- Window counts are kept exactly (stored_count, as Go's quant.StoredCount;
-- TestRedisStoredCountAgrees). Change both together; conformance_test.go
-- checks that they agree.
--
-- One call decides one or more checks, each a subject's policies. The
-- checks of one call are decided one after another, each all-or-nothing on
-- its own, and a check that fails (a key of the wrong type) fails alone.
--
-- KEYS      the state of each policy of each check, in order; all keys of
--           one check share its subject's hash tag. A call of several
--           checks to a Cluster node declares no keys and passes them at
--           the end of ARGV instead, in the same order: Redis requires a
--           script's declared keys to share one slot, and the checks of a
--           batch lie in many slots of one node. That call runs the
--           script's Cluster variant, whose first line flags it
--           allow-cross-slot-keys; a key the node does not serve fails
--           that check's GET, before it writes anything.
--           Numbers in ARGV are read with `+ 0`: Lua 5.1's tonumber parses
--           its string twice, and parsing is a good part of the script's
--           cost.
-- ARGV[1]   now in Unix microseconds, or "" to read the server's TIME.
--           Only tests set it.
-- ARGV[2]   extra milliseconds added to every TTL (0 in production; tests
--           on virtual time set it, since Redis expires on real time).
-- ARGV[3]   m, the number of checks.
-- then, per check: n, its number of policies, and per policy 6 values:
--           algorithm (1 token bucket, 2 leaky bucket, 3 fixed window,
--           4 sliding window log, 5 sliding window counter), rate or count,
--           burst, window in microseconds, cost, and the scale the rate and
--           burst were multiplied by (for the TTL).
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
-- nothing). Returns five integers per policy of each check: allowed (0/1),
-- limit, remaining, reset-after µs, retry-after µs. A call of one check
-- fails as a whole if that check fails; in a call of several, a failed
-- check's five integers per policy are replaced by one error reply.
--
-- The parts between "-- <shared: NAME>" and "-- </shared: NAME>" (the
-- clock, the bucket and count encodings, load, encode and ttl, and the
-- steps that bring each algorithm's state to now: refill, drain,
-- fixed_roll and sliding_roll) are charge.lua's too: charge.go splices
-- them into it, so both scripts read and write one state layout and a
-- charge brings a state to now with the very operations a check does.
-- Change them knowing both run them.

-- <shared: clock>
local US = 1000000

local now
if ARGV[1] ~= '' then
  now = ARGV[1] + 0
else
  local t = redis.call('TIME')
  now = t[1] * US + t[2]
end

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

local function ceil_us(v)
  if not (v > 0) then return 0 end
  if v > 1e15 then return 1e15 end
  return math.ceil(v)
end

local function floor_units(v)
  if not (v > 0) then return 0 end
  return math.floor(v)
end
-- </shared: clock>

-- K holds the keys: KEYS, or, in a call that declares none, the ARGV after
-- the checks' values (set once m is known, below).
local K = KEYS

-- <shared: refill>
-- refill brings a token bucket's stored tokens a, of time t, to now:
-- refilled at rate (per second) up to burst, or full at burst when there
-- is no state (t = 0). It returns the tokens and their time: now, or t
-- when now is not later.
local function refill(a, t, rate, burst)
  if t == 0 then return burst, now end
  local tokens = a
  if now > t then
    tokens = tokens + ((now - t) * rate) / US
    t = now
  end
  if tokens > burst then tokens = burst end
  return tokens, t
end
-- </shared: refill>

-- Each algorithm takes the stored state (a, b, t; t = 0 for none) and
-- returns the verdict (allowed 0/1, limit, remaining, reset-after µs,
-- retry-after µs) and the state after the check, as algorithm.go's decide
-- updates its counters: three numbers, not a table, so a check allocates
-- nothing it does not store.
local function token_bucket(a, t, rate, burst, cost)
  local tokens
  tokens, t = refill(a, t, rate, burst)
  local ok, retry = 0, 0
  if cost <= tokens then
    ok = 1
    tokens = tokens - cost
    -- a deposit (a negative cost) fills up to the burst
    if tokens > burst then tokens = burst end
  else
    retry = ceil_us((cost - tokens) * US / rate)
    for _ = 1, 3 do
      if not (tokens + (retry * rate) / US < cost) then break end
      retry = retry + 1
    end
  end
  return ok, floor_units(burst), floor_units(tokens),
    ceil_us((burst - tokens) * US / rate), retry, q29(tokens, math.floor), 0, t
end

-- <shared: buckets>
-- q29unpack reads the 5-byte number at position pos of s.
local function q29unpack(s, pos)
  return (struct.unpack('<d', '\0\0\0' .. string.sub(s, pos, pos + 4)))
end

-- q29pack writes x, which q29 has rounded, in 5 bytes.
local function q29pack(x)
  return string.sub(struct.pack('<d', x), 4)
end

local function header(alg, t)
  return struct.pack('<I4I3', math.fmod(t, P32), math.floor(t / P32) + alg * P21)
end

-- bucket_state reads a bucket's stored string s (or false, for none) as
-- a, t; a string of another length or algorithm reads as none (t = 0).
local function bucket_state(s, alg)
  if s and #s == 12 then
    local lo, hi = struct.unpack('<I4I3', s)
    if math.floor(hi / P21) == alg then
      return q29unpack(s, 8), math.fmod(hi, P21) * P32 + lo
    end
  end
  return 0, 0
end

local function bucket_value(alg, a, t)
  return header(alg, t) .. q29pack(a)
end

-- bucket_ttl is a token bucket's TTL: see ttl below.
local function bucket_ttl(a, rate, burst, f)
  return ceil_us((burst / f - a) * US / (rate / f)) + US
end
-- </shared: buckets>

-- full_bucket is keepRejected for a rejected token bucket: store it when
-- it is full at its burst at a time later than its stored state's (old_t).
local function full_bucket(old_t, a, t, burst)
  return t ~= old_t and a == q29(burst, math.floor)
end

-- one_bucket decides a check of a single token bucket, the common case,
-- whose key is K[k] and whose 6 values start at ARGV[j].
local function one_bucket(k, j)
  local rate, burst, cost = ARGV[j + 1] + 0, ARGV[j + 2] + 0, ARGV[j + 4] + 0
  local a, t = bucket_state(redis.call('GET', K[k]), 1)
  local ok, limit, remaining, reset, retry, na, _, nt = token_bucket(a, t, rate, burst, cost)
  if (ok == 1 and cost ~= 0) or (ok == 0 and full_bucket(t, na, nt, burst)) then
    local us = bucket_ttl(na, rate, burst, ARGV[j + 5] + 0)
    redis.call('SET', K[k], bucket_value(1, na, nt), 'PX', math.ceil(us / 1000) + ARGV[2])
  end
  return ok, limit, remaining, reset, retry
end

local m = ARGV[3] + 0

if #KEYS == 0 then
  K = {}
  local j = 4
  for _ = 1, m do j = j + 1 + 6 * ARGV[j] end
  for i = j, #ARGV do K[#K + 1] = ARGV[i] end
end

-- A lone check of a single token bucket is decided here, before the
-- functions that only other algorithms and several policies need are
-- created: each local function is a new closure on every call.
if m == 1 and ARGV[4] == '1' and ARGV[5] == '1' then
  return {one_bucket(1, 5)}
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

-- <shared: counts>
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
-- </shared: counts>

-- <shared: drain>
-- drain brings a leaky bucket's stored level a, of time t, to now: drained
-- at rate (per second) down to 0, or 0 when there is no state (t = 0). It
-- returns the level and its time: now, or t when now is not later.
local function drain(a, t, rate)
  if t == 0 then return 0, now end
  local level = a
  if now > t then
    local l = level - ((now - t) * rate) / US
    if l > 0 then level = l else level = 0 end
    t = now
  end
  return level, t
end
-- </shared: drain>

local function leaky_bucket(a, t, rate, burst, cost)
  local level
  level, t = drain(a, t, rate)
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
    ceil_us(level * US / rate), retry, q29_up_to(level, burst), 0, t
end

-- <shared: windows>
-- fixed_roll brings a fixed window's count n, of the window that started
-- at t, to now's window of w µs: a window that has ended (or none, t = 0)
-- gives 0 from the start of now's.
local function fixed_roll(n, t, w)
  local start = now - math.fmod(now, w)
  if t == 0 or start > t then return 0, start end
  return n, t
end

-- sliding_roll brings a sliding window counter's counts, cur of the window
-- that started at t and prev of the one before, to now's window of w µs:
-- in the next window cur becomes prev; any later (or none, t = 0) counts
-- nothing in either.
local function sliding_roll(cur, prev, t, w)
  local start = now - math.fmod(now, w)
  if t == 0 then return 0, 0, start end
  if start == t + w then return 0, cur, start end
  if start > t then return 0, 0, start end
  return cur, prev, t
end
-- </shared: windows>

local function fixed_window(n, t, count, w, cost)
  n, t = fixed_roll(n, t, w)
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
  return ok, floor_units(count), floor_units(count - n), fin - now, retry, stored_count(n), 0, t
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

local function sliding_counter(cur, prev, t, count, w, cost)
  cur, prev, t = sliding_roll(cur, prev, t, w)
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
    stored_count(cur), stored_count(prev), t
end

-- The log's state is its timestamps in order; the returned state is the
-- log as a commit would leave it, in place of a.
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
  return ok, capacity, floor_units(capacity - n), reset, retry, next, 0, 0
end

-- decide applies policy alg (1 to 5, as in ARGV) to the state a, b, t.
local function decide(alg, a, b, t, p1, p2, w, cost)
  if alg == 1 then return token_bucket(a, t, p1, p2, cost) end
  if alg == 2 then return leaky_bucket(a, t, p1, p2, cost) end
  if alg == 3 then return fixed_window(a, t, p1, w, cost) end
  if alg == 4 then return sliding_log(a, p1, w, cost) end
  return sliding_counter(a, b, t, p1, w, cost)
end

-- <shared: codec>
-- load reads the state of key for alg: a, b, t, with t = 0 for none; the
-- log's is its timestamps, in a.
local function load(key, alg)
  local s = redis.call('GET', key)
  if s then
    local n = #s
    if (alg == 4 and n >= 7 and (n - 7) % 8 == 0) or (alg == 5 and n == 17) or
      (alg ~= 4 and alg ~= 5 and n == 12) then
      if alg == 1 or alg == 2 then
        local a, t = bucket_state(s, alg)
        return a, 0, t
      end
      local lo, hi = struct.unpack('<I4I3', s)
      if math.floor(hi / P21) == alg then
        local t = math.fmod(hi, P21) * P32 + lo
        if alg == 4 then
          local log = {}
          for i = 1, (n - 7) / 8 do
            log[i] = struct.unpack('<d', s, 8 * i)
          end
          return log, 0, 0
        end
        if alg == 5 then
          local cur, prev = struct.unpack('<I5I5', s, 8)
          return cur, prev, t
        end
        return (struct.unpack('<I5', s, 8)), 0, t
      end
    end
  end
  if alg == 4 then return {}, 0, 0 end
  return 0, 0, 0
end

local function encode(alg, a, b, t)
  if alg == 4 then
    local parts = {header(4, 0)}
    for i = 1, #a do parts[i + 1] = struct.pack('<d', a[i]) end
    return table.concat(parts)
  end
  if alg == 5 then return header(5, t) .. struct.pack('<I5I5', a, b) end
  if alg == 3 then return header(3, t) .. struct.pack('<I5', a) end
  return bucket_value(alg, a, t)
end

-- ttl mirrors ttl() in algorithm.go: how long the new state matters.
-- A token bucket's TTL uses the unscaled limit (p / f): whatever share
-- the region gets later, the bucket is full by then, so dropping it
-- changes no decision.
local function ttl(alg, a, t, p1, p2, w, f)
  if alg == 1 then return bucket_ttl(a, p1, p2, f) end
  if alg == 2 then return ceil_us(a * US / p1) + US end
  if alg == 3 then return t + w - now + US end
  if alg == 5 then return t + 2 * w - now + US end
  if #a > 0 then return a[#a] + w - now + US end
  return US
end
-- </shared: codec>

-- store writes the new state a, b, t of the policy whose key is K[k]
-- and whose 6 values start at ARGV[j], with its TTL.
local function store(k, j, alg, a, b, t, p1, p2, w)
  local us = ttl(alg, a, t, p1, p2, w, ARGV[j + 5] + 0)
  redis.call('SET', K[k], encode(alg, a, b, t), 'PX', math.ceil(us / 1000) + ARGV[2])
end

-- subject decides a check of n policies whose keys start at K[k + 1]
-- and whose values at ARGV[j]: all of them or none. It returns the five
-- integers of each policy.
local function subject(k, j, n)
  local out, algs, p1s, p2s, ws, costs, as, bs, ts, keep = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
  local all = true
  for i = 1, n do
    local v = j + 6 * (i - 1)
    local alg = ARGV[v] + 0
    local p1, p2 = ARGV[v + 1] + 0, ARGV[v + 2] + 0
    local w, cost = ARGV[v + 3] + 0, ARGV[v + 4] + 0
    local a, b, t = load(K[k + i], alg)
    local ok, limit, remaining, reset, retry, na, nb, nt = decide(alg, a, b, t, p1, p2, w, cost)
    if ok == 0 then
      all = false
      keep[i] = alg == 1 and full_bucket(t, na, nt, p2)
    end
    algs[i], p1s[i], p2s[i], ws[i], costs[i], as[i], bs[i], ts[i] = alg, p1, p2, w, cost, na, nb, nt
    local o = 5 * (i - 1)
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = ok, limit, remaining, reset, retry
  end
  for i = 1, n do
    if (all and costs[i] > 0) or (not all and keep[i]) then
      store(k + i, j + 6 * (i - 1), algs[i], as[i], bs[i], ts[i], p1s[i], p2s[i], ws[i])
    end
  end
  return out
end

if m == 1 then
  return subject(0, 5, ARGV[4] + 0)
end

-- Several checks: each in its own protected call, so that one check's
-- error is that check's reply alone. The error that occurs, a key holding
-- another type, fails the check's GET, before it has written anything.
local function failed(e)
  if type(e) == 'table' and e.err then return e end
  return {err = tostring(e)}
end

local out, k, j = {}, 0, 4
for _ = 1, m do
  local n = ARGV[j] + 0
  if n == 1 and ARGV[j + 1] == '1' then
    local ok, allowed, limit, remaining, reset, retry = pcall(one_bucket, k + 1, j + 1)
    if ok then
      local o = #out
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = allowed, limit, remaining, reset, retry
    else
      out[#out + 1] = failed(allowed)
    end
  else
    local ok, res = pcall(subject, k, j + 1, n)
    if ok then
      local o = #out
      for i = 1, #res do out[o + i] = res[i] end
    else
      out[#out + 1] = failed(res)
    end
  end
  k, j = k + n, j + 1 + 6 * n
end
return out
