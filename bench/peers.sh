#!/usr/bin/env bash
# The peer comparison: Sluice against Gubernator, envoyproxy/ratelimit and a
# trivial Go handler, all on loopback on this machine, with the same load in
# the same run. See bench/README.md.
#
# Systems (every one answers "allowed" to every request of the run):
#   sluice_memory    sluice serve, memory store, POST /v1/check
#   sluice_redis     sluice serve, Redis store, POST /v1/check
#   gubernator       Gubernator v2.13.0, one node, HTTP POST /v1/GetRateLimits
#   envoy_ratelimit  envoyproxy/ratelimit, Redis backend, HTTP POST /json
#   trivial          bench/trivial: reads the body, answers 200 and 33 bytes
#                    of JSON; the cost of net/http's server alone (Sluice's
#                    gateway listener runs on fasthttp)
#
# Equivalent work: USERS (10 000) subjects, a request names one of them in
# turn, and each subject may spend 1000 per second:
#   - Sluice: one token bucket policy, rate_per_sec 1000, burst 1000, keyed
#     by the request's "user";
#   - Gubernator: TOKEN_BUCKET, limit 1000, duration 1000 ms, unique_key the
#     user (Gubernator's token bucket refills all at once at the end of the
#     duration: the nearest of its algorithms);
#   - envoy ratelimit: a descriptor user=<user> with 1000 requests per
#     second (a fixed one-second window, INCR + EXPIRE in Redis: the only
#     algorithm it has). Its defaults are kept (REDIS_POOL_SIZE 10, no
#     implicit pipelining window), as a user deploying it would have them.
# At saturation on two cores no subject comes near 1000/s, so every answer
# is an admission; the script fails if any is not a 2xx.
#
# Phases, each interleaved round by round so that a noisy neighbour hits
# every system alike:
#   1. saturation: wrk, closed loop, CONNS connections, ROUNDS x ROUND_SECS
#      per system; the figure is the median round;
#   2. fixed rate: bench/loadgen, open loop at RATE requests/s (default
#      RATE_FRACTION, 0.7, of the slowest system's saturation figure, so
#      that every system sustains it; a system that falls short is named),
#      latency measured from each request's due time; p50 and p99 are the
#      median over the rounds.
# Sluice on Redis counts only what Redis decided: /metrics is read before
# and after the saturation phase, and its throughput is multiplied by the
# share of checks whose source was the store; breaker opens are reported.
# During the fixed-rate phase each system's CPU time (user and system, from
# /proc) is read before and after every round: CPU microseconds per request
# for the daemon and, for the systems on Redis, for redis-server. Unlike
# throughput, this cost hardly moves when other work shares the machine,
# and it is what the saturation figures divide: the ratios of total CPU
# per request are printed beside those of throughput.
#
# Last, region/bench_test.go measures the allocations per request of
# POST /v1/check and GET /v1/authz through the handler, without the network.
#
# Knobs (environment): ROUNDS (3), ROUND_SECS (10), FIXED_SECS (ROUND_SECS),
# SATURATION (1; 0 skips the saturation phase, and then RATE must be set:
# a light run for the CPU costs alone),
# CONNS (50), WRK_THREADS (2), USERS (10000), RATE (auto), RATE_FRACTION
# (0.7), HTTP_BENCH_N (50000 iterations of each Go benchmark), SYSTEMS (all, in
# the order above), SLUICE_REDIS_FLAGS (more flags for sluice serve on Redis,
# e.g. --store-timeout 20ms), SLUICE_TOOLS (cache of the peers' binaries, default
# ~/.cache/sluice-tools), SLUICE_BASE_BIN (another sluice binary, e.g. a build of
# an earlier commit: it runs beside this one as base_memory and base_redis,
# interleaved round by round, and the ratios of this build over it are
# printed). Prints `BENCH <name> <value> <unit>` lines last.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
ROUND_SECS=${ROUND_SECS:-10}
FIXED_SECS=${FIXED_SECS:-$ROUND_SECS}
CONNS=${CONNS:-50}
WRK_THREADS=${WRK_THREADS:-2}
USERS=${USERS:-10000}
RATE=${RATE:-auto}
RATE_FRACTION=${RATE_FRACTION:-0.7}
SATURATION=${SATURATION:-1}
SYSTEMS=${SYSTEMS:-"sluice_memory sluice_redis gubernator envoy_ratelimit trivial"}
[ -z "${SLUICE_BASE_BIN:-}" ] || SYSTEMS="$SYSTEMS base_memory base_redis"
TOOLS=${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}

GUBERNATOR_MOD=github.com/gubernator-io/gubernator/v2
GUBERNATOR_VERSION=v2.13.0

BENCH_NAME=peers
. bench/lib.sh

[ "$SATURATION" = 1 ] || [ "$RATE" != auto ] || die "SATURATION=0 needs a RATE"

for tool in go wrk redis-server redis-cli curl; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done

# ---- build ----------------------------------------------------------------

gubernator_bin=$(install_tool "$GUBERNATOR_MOD/cmd/gubernator" "$GUBERNATOR_VERSION" gubernator)
install_ratelimit
log "building sluice, bench/loadgen, bench/trivial"
go build -o "$work/sluice" ./cmd/sluice
go build -o "$work/loadgen" ./bench/loadgen
go build -o "$work/trivial" ./bench/trivial

# ---- start ----------------------------------------------------------------

# http_ok CURL ARGS...: whether the request curl makes is answered 2xx.
http_ok() { curl -fsS -o /dev/null "$@" 2>/dev/null; }

start_redis
# Per system: URL and the JSON body, {user} standing for the subject.
declare -A url body

cat >"$work/policies.json" <<'EOF'
[{"id": "bench", "match": {"routes": ["/bench"]}, "algorithm": "token_bucket",
  "rate_per_sec": 1000, "burst": 1000, "mode": "enforce",
  "description": "the peer comparison: 1000/s per user, every request allowed"}]
EOF
sm_port=$(freeport); sr_port=$(freeport)
start sluice_memory "$work/sluice" serve --listen "127.0.0.1:$sm_port" --policies "$work/policies.json" --log-level warn
start sluice_redis "$work/sluice" serve --listen "127.0.0.1:$sr_port" --policies "$work/policies.json" --log-level warn \
  --store "redis://127.0.0.1:$redis_port" ${SLUICE_REDIS_FLAGS:-}

if [ -n "${SLUICE_BASE_BIN:-}" ]; then
  bm_port=$(freeport); br_port=$(freeport)
  start base_memory "$SLUICE_BASE_BIN" serve --listen "127.0.0.1:$bm_port" --policies "$work/policies.json" --log-level warn
  start base_redis "$SLUICE_BASE_BIN" serve --listen "127.0.0.1:$br_port" --policies "$work/policies.json" --log-level warn \
    --store "redis://127.0.0.1:$redis_port" ${SLUICE_REDIS_FLAGS:-}
  url[base_memory]="http://127.0.0.1:$bm_port/v1/check"
  url[base_redis]="http://127.0.0.1:$br_port/v1/check"
fi

gh_port=$(freeport); gg_port=$(freeport); gm_port=$(freeport)
start gubernator env GUBER_HTTP_ADDRESS="127.0.0.1:$gh_port" GUBER_GRPC_ADDRESS="127.0.0.1:$gg_port" \
  GUBER_PEER_DISCOVERY_TYPE=member-list GUBER_MEMBERLIST_ADDRESS="127.0.0.1:$gm_port" \
  GUBER_MEMBERLIST_BIND_ADDRESS="127.0.0.1:$gm_port" GUBER_MEMBERLIST_KNOWN_NODES="127.0.0.1:$gm_port" \
  GUBER_LOG_LEVEL=warn "$gubernator_bin"

write_envoy_config 1000
start_envoy_ratelimit envoy_ratelimit REDIS_URL="127.0.0.1:$redis_port"
rh_port=$envoy_http_port

tr_port=$(freeport)
start trivial "$work/trivial" --listen "127.0.0.1:$tr_port"

url[sluice_memory]="http://127.0.0.1:$sm_port/v1/check"
url[sluice_redis]="http://127.0.0.1:$sr_port/v1/check"
body[sluice_memory]='{"user":"{user}","route":"/bench","method":"GET"}'
body[sluice_redis]=${body[sluice_memory]}
body[base_memory]=${body[sluice_memory]}
body[base_redis]=${body[sluice_memory]}
url[gubernator]="http://127.0.0.1:$gh_port/v1/GetRateLimits"
body[gubernator]='{"requests":[{"name":"bench","unique_key":"{user}","hits":1,"limit":1000,"duration":1000,"algorithm":"TOKEN_BUCKET"}]}'
url[envoy_ratelimit]="http://127.0.0.1:$rh_port/json"
body[envoy_ratelimit]='{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"{user}"}]}]}'
url[trivial]="http://127.0.0.1:$tr_port/"
body[trivial]='{"user":"{user}"}'

for s in $SYSTEMS; do
  [ -n "${url[$s]:-}" ] || die "unknown system $s (want some of: ${!url[*]})"
  wait_until "$s" "answer ${url[$s]}" http_ok -X POST -H 'Content-Type: application/json' -d "${body[$s]//\{user\}/warmup}" "${url[$s]}"
  # One check each, to show that it decides and admits. A Sluice that has
  # just started may answer its first checks from the fallback while its
  # Redis connections open: a few tries.
  for try in 1 2 3 4 5 6 7 8 9 10; do
    answer=$(curl -sS -X POST -H 'Content-Type: application/json' -d "${body[$s]//\{user\}/probe$try}" "${url[$s]}")
    [[ "$s" != sluice_* && "$s" != base_* || "$answer" == *'"source":"store"'* ]] && break
    sleep 0.2
  done
  case "$s:$answer" in
    sluice_*:*'"allowed":true'*'"source":"store"'* | base_*:*'"allowed":true'*'"source":"store"'* | gubernator:*UNDER_LIMIT* | envoy_ratelimit:*'"overallCode":"OK"'* | trivial:*) ;;
    *) die "$s answered $answer" ;;
  esac
  log "$s ready at ${url[$s]}"
done

# ---- saturation -----------------------------------------------------------

metric() { metric_at "$sr_port" "$1"; } # its value on sluice_redis, 0 if absent
redis_checks() { metric 'sluice_checks_total{'; }
redis_store_checks() { metric 'sluice_checks_total{decision="allowed",source="store"}'; }
redis_breaker_opens() { metric 'sluice_breaker_opens_total'; }

declare -A sat lat50 lat99 cpu rcpu
before_all=$(redis_checks); before_store=$(redis_store_checks); before_opens=$(redis_breaker_opens)
if [ -n "${SLUICE_BASE_BIN:-}" ]; then
  base_all0=$(metric_at "$br_port" 'sluice_checks_total{'); base_store0=$(metric_at "$br_port" 'sluice_checks_total{decision="allowed",source="store"}')
fi
sat_rounds=$ROUNDS
[ "$SATURATION" = 1 ] || sat_rounds=0
for r in $(seq 1 "$sat_rounds"); do
  for s in $SYSTEMS; do
    out=$(wrk -t "$WRK_THREADS" -c "$CONNS" -d "${ROUND_SECS}s" -s bench/rotate.lua "${url[$s]}" -- POST "$USERS" "${body[$s]}" 2>&1) ||
      { echo "$out" >&2; die "wrk against $s failed"; }
    rps=$(echo "$out" | awk '/^Requests\/sec:/ { print $2 }')
    bad=$(echo "$out" | awk '/Non-2xx or 3xx responses:/ { print $NF } /Socket errors:/ { print "socket-errors" }')
    [ -n "$rps" ] || { echo "$out" >&2; die "no Requests/sec from wrk against $s"; }
    [ -z "$bad" ] || { echo "$out" >&2; die "$s: not every answer was a 2xx ($bad)"; }
    sat[$s]="${sat[$s]:-} $rps"
    log "saturation round $r $s: $rps req/s"
  done
done
after_all=$(redis_checks); after_store=$(redis_store_checks); after_opens=$(redis_breaker_opens)

declare -A satm
if [ "$SATURATION" = 1 ]; then
  for s in $SYSTEMS; do satm[$s]=$(echo "${sat[$s]}" | median); done
fi

store_share=1
opens=0
if [ "$SATURATION" = 1 ] && [[ " $SYSTEMS " == *" sluice_redis "* ]]; then
  checks=$((after_all - before_all)); store=$((after_store - before_store)); opens=$((after_opens - before_opens))
  [ "$checks" -gt 0 ] || die "sluice_redis counted no checks in /metrics"
  store_share=$(awk -v a="$store" -v b="$checks" 'BEGIN { printf "%.6f", a / b }')
  log "sluice_redis: $store of $checks checks decided by Redis, $opens breaker opens; after the run:"
  curl -fsS "http://127.0.0.1:$sr_port/metrics" | grep -E '^sluice_(checks_total|breaker|store_|degraded)' >&2 || true
  satm[sluice_redis_total]=${satm[sluice_redis]}
  satm[sluice_redis]=$(awk -v v="${satm[sluice_redis]}" -v s="$store_share" 'BEGIN { printf "%.2f", v * s }')
fi

# The base build on Redis, counted as this one is: only what Redis decided.
if [ "$SATURATION" = 1 ] && [ -n "${SLUICE_BASE_BIN:-}" ]; then
  b_checks=$(($(metric_at "$br_port" 'sluice_checks_total{') - base_all0))
  b_store=$(($(metric_at "$br_port" 'sluice_checks_total{decision="allowed",source="store"}') - base_store0))
  [ "$b_checks" -gt 0 ] || die "base_redis counted no checks in /metrics"
  log "base_redis: $b_store of $b_checks checks decided by Redis"
  satm[base_redis_total]=${satm[base_redis]}
  satm[base_redis]=$(awk -v v="${satm[base_redis]}" -v a="$b_store" -v b="$b_checks" 'BEGIN { printf "%.2f", v * a / b }')
fi

# ---- fixed rate -----------------------------------------------------------

if [ "$RATE" = auto ]; then
  # What each system answers, from whatever source: the rate must be one
  # that every daemon keeps up with, whoever decides.
  RATE=$(for s in $SYSTEMS; do echo "${satm[${s}_total]:-${satm[$s]}}"; done | fixed_rate "$RATE_FRACTION")
fi
log "fixed rate: $RATE req/s (RATE_FRACTION $RATE_FRACTION of the slowest saturation figure unless RATE is set)"
ticks=$(getconf CLK_TCK)
declare -A on_redis=([sluice_redis]=1 [envoy_ratelimit]=1 [base_redis]=1)
for r in $(seq 1 "$ROUNDS"); do
  for s in $SYSTEMS; do
    measure "$s" "$pid_redis" "$work/loadgen" -url "${url[$s]}" -body "${body[$s]}" -users "$USERS" -rate "$RATE" \
      -duration "${FIXED_SECS}s" -warmup 1s -conns "$CONNS"
    # A non-2xx answer means the system did other work than the rest: stop.
    # A transport error (a stalled connection on a busy machine) is named
    # in the log and the round still counts, its latencies showing the stall.
    [ "$(field non2xx)" = 0 ] || { echo "$out" >&2; die "$s: non-2xx answers at $RATE/s"; }
    [ "$(field errors)" = 0 ] || log "warning: $s: $(field errors) transport errors at $RATE/s ($(echo "$out" | grep -m1 '^first error'))"
    warn_backlog "$s" "$RATE"
    lat50[$s]="${lat50[$s]:-} $(field p50_us)"
    lat99[$s]="${lat99[$s]:-} $(field p99_us)"
    # The warm-up second is loaded too: count its requests (RATE of them).
    n=$(awk -v q="$(field requests)" -v r="$RATE" 'BEGIN { print q + r }')
    cpu[$s]="${cpu[$s]:-} $(awk -v d="$ticks_server" -v t="$ticks" -v n="$n" 'BEGIN { printf "%.2f", d / t * 1e6 / n }')"
    if [ -n "${on_redis[$s]:-}" ]; then
      rcpu[$s]="${rcpu[$s]:-} $(awk -v d="$ticks_redis" -v t="$ticks" -v n="$n" 'BEGIN { printf "%.2f", d / t * 1e6 / n }')"
    fi
    rlast=none
    [ -z "${rcpu[$s]:-}" ] || rlast="${rcpu[$s]##* } us"
    log "fixed rate round $r $s: CPU per request ${cpu[$s]##* } us (redis-server $rlast)"
    log_latencies "$r" "$s"
  done
done
fixed_share=1
if [[ " $SYSTEMS " == *" sluice_redis "* ]]; then
  checks=$(($(redis_checks) - after_all)); store=$(($(redis_store_checks) - after_store))
  fixed_share=$(awk -v a="$store" -v b="$checks" 'BEGIN { printf "%.6f", (b > 0 ? a / b : 0) }')
  log "sluice_redis at $RATE/s: $store of $checks checks decided by Redis"
fi

# ---- the HTTP path, without the network -----------------------------------

# region/bench_test.go: POST /v1/check and GET /v1/authz through the handler
# the data-plane server runs, request conversion included (BenchmarkServer*),
# and through the net/http handler alone (BenchmarkHTTP*), on the memory
# store; allocations per request are exact, ns/op is one core's time on this
# shared machine.
log "HTTP path allocations (go test -bench 'Benchmark(Server|HTTP)' ./region/)"
gobench=$(go test -run '^$' -bench '^Benchmark(Server|HTTP)(Check|Authz)$' -benchmem -benchtime "${HTTP_BENCH_N:-50000}x" -count 1 ./region/ 2>&1) ||
  { echo "$gobench" >&2; die "region benchmarks failed"; }
echo "$gobench" | grep '^Benchmark' >&2

# ---- report ---------------------------------------------------------------

echo "---- peers: saturation (median of $sat_rounds x ${ROUND_SECS}s, wrk -c $CONNS) and p50/p99 and CPU per request at $RATE/s (loadgen, open loop) ----"
declare -A cpum
for s in $SYSTEMS; do
  # CPU per request: the daemon's, plus redis-server's for those on Redis.
  d=$(echo "${cpu[$s]}" | median); rd=0
  [ -z "${rcpu[$s]:-}" ] || rd=$(echo "${rcpu[$s]}" | median)
  cpum[$s]=$(awk -v a="$d" -v b="$rd" 'BEGIN { printf "%.2f", a + b }')
  printf 'BENCH peers_%s_cpu_us_per_request %s us\n' "$s" "$d"
  [ -z "${rcpu[$s]:-}" ] || printf 'BENCH peers_%s_redis_cpu_us_per_request %s us\n' "$s" "$rd"
  [ "$SATURATION" != 1 ] || printf 'BENCH peers_%s_rps %s req/s\n' "$s" "${satm[$s]}"
  printf 'BENCH peers_%s_p50_us_at_fixed_rate %s us\n' "$s" "$(echo "${lat50[$s]}" | median)"
  printf 'BENCH peers_%s_p99_us_at_fixed_rate %s us\n' "$s" "$(echo "${lat99[$s]}" | median)"
done
printf 'BENCH peers_fixed_rate %s req/s\n' "$RATE"
if [ "$SATURATION" = 1 ] && [[ " $SYSTEMS " == *" sluice_redis "* ]]; then
  printf 'BENCH peers_sluice_redis_all_sources_rps %s req/s\n' "${satm[sluice_redis_total]}"
  printf 'BENCH peers_sluice_redis_store_share %s %%\n' "$(awk -v s="$store_share" 'BEGIN { printf "%.3f", s * 100 }')"
  printf 'BENCH peers_sluice_redis_breaker_opens %s count\n' "$opens"
  printf 'BENCH peers_sluice_redis_store_share_at_fixed_rate %s %%\n' "$(awk -v s="$fixed_share" 'BEGIN { printf "%.3f", s * 100 }')"
fi
echo "$gobench" | awk '
function metric(unit,   i) { for (i = 3; i < NF; i += 2) if ($(i + 1) == unit) return $i; return "" }
/^BenchmarkServerCheck/ { printf "BENCH http_check_allocs_per_request %s allocs\nBENCH http_check_ns_per_request %s ns\n", metric("allocs/op"), metric("ns/op") }
/^BenchmarkServerAuthz/ { printf "BENCH http_authz_allocs_per_request %s allocs\nBENCH http_authz_ns_per_request %s ns\n", metric("allocs/op"), metric("ns/op") }
/^BenchmarkHTTPCheck/ { printf "BENCH http_check_handler_allocs_per_request %s allocs\n", metric("allocs/op") }
/^BenchmarkHTTPAuthz/ { printf "BENCH http_authz_handler_allocs_per_request %s allocs\n", metric("allocs/op") }'
ratio() { # ratio NAME A B
  [ -n "${satm[$2]:-}" ] && [ -n "${satm[$3]:-}" ] || return 0
  awk -v n="$1" -v a="${satm[$2]}" -v b="${satm[$3]}" 'BEGIN { if (b > 0) printf "BENCH %s %.3f ratio\n", n, a / b }'
}
# cost_ratio NAME A B: B's total CPU per request over A's (how many times
# less CPU A spends on a request), the cost behind the throughput ratios.
cost_ratio() {
  [ -n "${cpum[$2]:-}" ] && [ -n "${cpum[$3]:-}" ] || return 0
  awk -v n="$1" -v a="${cpum[$2]}" -v b="${cpum[$3]}" 'BEGIN { if (a > 0) printf "BENCH %s %.3f ratio\n", n, b / a }'
}
cost_ratio peers_cpu_envoy_ratelimit_over_sluice_redis sluice_redis envoy_ratelimit
cost_ratio peers_cpu_gubernator_over_sluice_memory sluice_memory gubernator
cost_ratio peers_cpu_trivial_over_sluice_memory sluice_memory trivial
ratio peers_sluice_redis_over_envoy_ratelimit sluice_redis envoy_ratelimit
ratio peers_sluice_memory_over_gubernator sluice_memory gubernator
ratio peers_sluice_memory_over_trivial sluice_memory trivial
if [ -n "${SLUICE_BASE_BIN:-}" ]; then
  ratio peers_sluice_memory_over_base_memory sluice_memory base_memory
  ratio peers_sluice_redis_over_base_redis sluice_redis base_redis
  cost_ratio peers_cpu_base_memory_over_sluice_memory sluice_memory base_memory
  cost_ratio peers_cpu_base_redis_over_sluice_redis sluice_redis base_redis
fi
# The slower Sluice's p99 at the fixed rate over the faster peer's: at most 1
# when both Sluice daemons answer as fast as both peers or faster.
sluice_p99=0; peer_p99=
for s in sluice_memory sluice_redis gubernator envoy_ratelimit; do
  [[ " $SYSTEMS " == *" $s "* ]] || continue
  v=$(echo "${lat99[$s]}" | median)
  case $s in
    sluice_*) sluice_p99=$(awk -v a="$sluice_p99" -v b="$v" 'BEGIN { print (b > a ? b : a) }') ;;
    *) peer_p99=$(awk -v a="${peer_p99:-$v}" -v b="$v" 'BEGIN { print (b < a ? b : a) }') ;;
  esac
done
if [ -n "$peer_p99" ] && [ "$sluice_p99" != 0 ]; then
  awk -v a="$sluice_p99" -v b="$peer_p99" 'BEGIN { if (b > 0) printf "BENCH peers_sluice_p99_over_best_peer_p99 %.3f ratio\n", a / b }'
fi
bash bench/peers_rls.sh # then the gRPC rate limit services (bench/README.md); make bench-peers runs bench/peers_tls.sh after
