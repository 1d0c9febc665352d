-- Sluice: charge a subject's policies after the fact, and keep the
-- reservations that a charge settles.
--
-- This is charge.go's chargeCounters in Lua, in the same order on the same
-- doubles, so that the Redis store charges bit for bit as the memory store
-- does; storetest's charge tests check that the stores agree. The state it
-- reads and writes, and its TTLs, are redis.lua's: each "-- <shared: NAME>"
-- line below is replaced by that part of redis.lua (see chargeScript in
-- charge.go), which defines US, now, q29, ceil_us, stored_count, load,
-- encode and ttl, and the steps that bring a state to now (refill, drain,
-- fixed_roll, sliding_roll). It is a script of its own: a charge is never
-- on a request's critical path, so it is sent on its own, never batched
-- with checks.
--
-- ARGV[1]   now in Unix microseconds, or "" to read the server's TIME.
-- ARGV[2]   extra milliseconds added to every TTL (tests on virtual time).
-- ARGV[3]   the operation: "c" to charge, "r" to reserve.
--
-- Charge: KEYS are the state of each policy, then, when ARGV[5] is "1", the
-- reservation to settle. ARGV[4] is n, the number of policies; then, per
-- policy, 7 values: algorithm (1 token bucket, 2 leaky bucket, 3 fixed
-- window, 5 sliding window counter; the log cannot be charged), rate or
-- count, burst, window in microseconds, cost, the scale (for the TTL),
-- and the policy's name (to find its estimate in the reservation).
-- Returns now, then per policy the state written: a and b as exact
-- decimal strings, t as an integer, and the estimate the settled
-- reservation held for the policy (0 when none). An unknown or expired reservation
-- fails the call with "unknown reservation", before anything is written.
--
-- Reserve: KEYS[1] is the reservation; ARGV[4] its TTL in microseconds;
-- ARGV[5] the estimate of each policy as a JSON object of name to cost.
-- It is stored as "at exp json", at and exp in Unix microseconds, and
-- expires at exp (a settlement at or after exp finds none).

-- <shared: clock>

if ARGV[3] == 'r' then
  local ttl = ARGV[4] + 0
  redis.call('SET', KEYS[1], string.format('%d %d ', now, now + ttl) .. ARGV[5],
    'PX', math.ceil(ttl / 1000) + ARGV[2])
  return 1
end

-- <shared: buckets>
-- <shared: counts>
-- <shared: codec>
-- <shared: refill>
-- <shared: drain>
-- <shared: windows>

-- charge is chargeCounters: the state brought to now, plus units.
local function charge(alg, a, b, t, p1, p2, w, units, at)
  if alg == 1 then
    local tokens
    tokens, t = refill(a, t, p1, p2)
    tokens = tokens - units
    if tokens > p2 then tokens = p2 end
    return q29(tokens, math.floor), 0, t
  end
  if alg == 2 then
    local level
    level, t = drain(a, t, p1)
    level = level + units
    if not (level > 0) then level = 0 end
    return q29(level, math.ceil), 0, t
  end
  local wa = at - math.fmod(at, w)
  if alg == 3 then
    a, t = fixed_roll(a, t, w)
    if units >= 0 or wa == t then a = stored_count(a + units) end
    return a, 0, t
  end
  a, b, t = sliding_roll(a, b, t, w)
  if units >= 0 or wa == t then
    a = stored_count(a + units)
  elseif wa + w == t then
    b = stored_count(b + units)
  end
  return a, b, t
end

local n = ARGV[4] + 0
local held, at = {}, 0
if ARGV[5] == '1' then
  local v = redis.call('GET', KEYS[n + 1])
  local sat, sexp, js
  if v then sat, sexp, js = string.match(v, '^(%d+) (%d+) (.*)$') end
  if not sat or now >= sexp + 0 then
    return redis.error_reply('unknown reservation')
  end
  held, at = cjson.decode(js), sat + 0
  redis.call('DEL', KEYS[n + 1])
end

local out = {now}
for i = 1, n do
  local v = 6 + 7 * (i - 1)
  local alg = ARGV[v] + 0
  local p1, p2, w = ARGV[v + 1] + 0, ARGV[v + 2] + 0, ARGV[v + 3] + 0
  local est = tonumber(held[ARGV[v + 6]]) or 0
  local units = ARGV[v + 4] - est
  local a, b, t = load(KEYS[i], alg)
  a, b, t = charge(alg, a, b, t, p1, p2, w, units, at)
  local us = ttl(alg, a, t, p1, p2, w, ARGV[v + 5] + 0)
  redis.call('SET', KEYS[i], encode(alg, a, b, t), 'PX', math.ceil(us / 1000) + ARGV[2])
  local o = #out
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = string.format('%.17g', a), string.format('%.17g', b), t, est
end
return out
