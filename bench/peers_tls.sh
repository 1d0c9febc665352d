#!/usr/bin/env bash
# The TLS round of the peer comparison: what TLS costs per request, and
# Sluice's rate limit service against envoyproxy/ratelimit's with both on
# TLS. bench/peers.sh runs it after bench/peers_rls.sh; it runs alone too.
# See bench/README.md.
#
# A CA and a server certificate for 127.0.0.1 (ECDSA P-256) are made with
# openssl at the start, in the scratch directory. Systems, each plaintext and
# TLS side by side, on one redis-server:
#   sluice_memory, sluice_memory_tls   sluice serve, memory store, POST
#       /v1/check, the _tls one with --tls-cert-file on the gateway listener
#   sluice_redis, sluice_redis_tls     the same on the Redis store (Redis
#       itself in plaintext: the TLS measured is the gateway's)
#   rls_sluice, rls_sluice_tls         sluice serve --rls-listen, Redis
#       database 1, the _tls one with --rls-tls-cert-file (ALPN h2)
#   rls_envoy_ratelimit, rls_envoy_ratelimit_tls   envoyproxy/ratelimit's
#       gRPC service (bench/peers.sh's build), Redis database 0, the _tls
#       one with GRPC_SERVER_USE_TLS and GRPC_SERVER_TLS_CERT/_KEY
# The work is that of bench/peers.sh (HTTP) and bench/peers_rls.sh (gRPC):
# USERS subjects in turn, 1000 per second each, so every answer admits.
#
# Phases, interleaved round by round (the order reversed every other round)
# so that a neighbour on the machine hits plaintext and TLS alike:
#   1. HTTP, fixed rate: bench/loadgen (https:// with -tls-ca for the TLS
#      systems), open loop at RATE requests/s over CONNS kept-alive
#      connections; the daemon's and redis-server's CPU time per request
#      (from /proc, warm-up included), p50 and p99;
#   2. gRPC, saturation: bench/rlsload (-tls -tls-ca for the TLS systems),
#      closed loop, RLS_STREAMS calls over RLS_CONNS connections; calls per
#      second (Sluice's multiplied by the share decided by Redis, as in
#      bench/peers_rls.sh) and the CPU per call of the server, of
#      redis-server and of rlsload.
# Connections are kept alive, as a gateway keeps them: the figures are the
# cost of encrypting and decrypting each request, the handshakes being a
# few per round.
#
# Knobs (environment): ROUNDS (3), ROUND_SECS (10), USERS (10000), RATE
# (2000), CONNS (50), RLS_CONNS (4), RLS_STREAMS (50), SLUICE_TOOLS. Prints
# `BENCH peers_tls_<name> <value> <unit>` lines last, with the load average
# before and after.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
ROUND_SECS=${ROUND_SECS:-10}
USERS=${USERS:-10000}
RATE=${RATE:-2000}
CONNS=${CONNS:-50}
RLS_CONNS=${RLS_CONNS:-4}
RLS_STREAMS=${RLS_STREAMS:-50}
TOOLS=${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}

BENCH_NAME=peers_tls
. bench/lib.sh

for tool in go redis-server redis-cli curl openssl; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- build and certificates -----------------------------------------------

install_ratelimit
log "building sluice, bench/loadgen, bench/rlsload"
go build -o "$work/sluice" ./cmd/sluice
go build -o "$work/loadgen" ./bench/loadgen
go build -o "$work/rlsload" ./bench/rlsload

# make_certs: $work/ca.crt and the server pair $work/server.{crt,key},
# valid for 127.0.0.1 and localhost.
make_certs() {
  local d=$work
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bench-ca \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
    -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$d/server.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 1 \
    -extfile "$d/server.ext" -out "$d/server.crt" 2>/dev/null
}
make_certs || die "openssl could not make the certificates"
tls_server=(--tls-cert-file "$work/server.crt" --tls-key-file "$work/server.key")

# ---- start ----------------------------------------------------------------

start_redis
cat >"$work/policies.json" <<'EOF'
[{"id": "bench", "match": {"routes": ["/bench"]}, "algorithm": "token_bucket",
  "rate_per_sec": 1000, "burst": 1000, "mode": "enforce",
  "description": "the peer comparison: 1000/s per user, every request allowed"}]
EOF
write_envoy_config 1000
echo '[]' >"$work/rls-policies.json"

HTTP_SYSTEMS="sluice_memory sluice_memory_tls sluice_redis sluice_redis_tls"
RLS_SYSTEMS="rls_sluice rls_sluice_tls rls_envoy_ratelimit rls_envoy_ratelimit_tls"
declare -A url addr hport
for s in $HTTP_SYSTEMS; do
  p=$(freeport) hport[$s]=$p
  args=(serve --listen "127.0.0.1:$p" --policies "$work/policies.json" --log-level warn)
  case $s in *redis*) args+=(--store "redis://127.0.0.1:$redis_port") ;; esac
  case $s in
    *_tls) args+=("${tls_server[@]}") url[$s]="https://127.0.0.1:$p/v1/check" ;;
    *) url[$s]="http://127.0.0.1:$p/v1/check" ;;
  esac
  start "$s" "$work/sluice" "${args[@]}"
done
for s in rls_sluice rls_sluice_tls; do
  p=$(freeport) g=$(freeport) hport[$s]=$p addr[$s]="127.0.0.1:$g"
  args=(serve --listen "127.0.0.1:$p" --rls-listen "127.0.0.1:$g" --policies "$work/rls-policies.json"
    --envoy-config "$envoy_config" --log-level warn --store "redis://127.0.0.1:$redis_port/1")
  [ "$s" = rls_sluice ] || args+=(--rls-tls-cert-file "$work/server.crt" --rls-tls-key-file "$work/server.key")
  start "$s" "$work/sluice" "${args[@]}"
done
for s in rls_envoy_ratelimit rls_envoy_ratelimit_tls; do
  env=(REDIS_URL="127.0.0.1:$redis_port")
  [ "$s" = rls_envoy_ratelimit ] ||
    env+=(GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT="$work/server.crt" GRPC_SERVER_TLS_KEY="$work/server.key")
  start_envoy_ratelimit "$s" "${env[@]}"
  addr[$s]="127.0.0.1:$envoy_grpc_port"
done

# tls_args SYSTEM: the load generator's TLS flags for SYSTEM, none for a
# plaintext one.
tls_args() { case $1 in *_tls) echo "$2" -tls-ca "$work/ca.crt" ;; esac; }
# metric SYSTEM NAME: a Sluice system's metric (its gateway listener, over
# TLS for the HTTP _tls systems), 0 if absent.
metric() {
  local scheme=http
  case $1 in sluice_*_tls) scheme=https ;; esac
  curl -fsS --cacert "$work/ca.crt" "$scheme://127.0.0.1:${hport[$1]}/metrics" | metric_sum "$2"
}
store_checks() { metric "$1" 'sluice_checks_total{decision="allowed",source="store"}'; }
checks() { metric "$1" 'sluice_checks_total{'; }
rlsload() { # rlsload SYSTEM ARGS...: bench/rlsload against SYSTEM
  local s=$1; shift
  "$work/rlsload" -addr "${addr[$s]}" $(tls_args "$s" -tls) -domain bench -entries 'user={user}' -users "$USERS" "$@" 2>&1
}

body='{"user":"{user}","route":"/bench","method":"GET"}'
# admits SYSTEM: whether SYSTEM answers a check "allowed", decided by the
# store if it is on Redis.
admits() {
  local answer
  answer=$(curl -sS --cacert "$work/ca.crt" -X POST -H 'Content-Type: application/json' \
    -d "${body//\{user\}/probe}" "${url[$1]}" 2>/dev/null) && [[ "$answer" == *'"allowed":true'* ]] &&
    [[ "$1" != *redis* || "$answer" == *'"source":"store"'* ]]
}
for s in $HTTP_SYSTEMS; do
  wait_until "$s" "answer at ${url[$s]}" admits "$s"
  log "$s ready at ${url[$s]}"
done
for s in $RLS_SYSTEMS; do
  wait_until "$s" "answer OK on ${addr[$s]}" rls_answers "${hport[$s]:-}" rlsload "$s"
  log "$s ready at ${addr[$s]}"
done

tck=$(getconf CLK_TCK)
# per TICKS N: microseconds of CPU per request of TICKS over N requests.
per() { awk -v d="$1" -v n="$2" -v t="$tck" 'BEGIN { printf "%.2f", (n > 0 ? d / t * 1e6 / n : 0) }'; }
declare -A cpu rcpu gcpu lat50 lat99 sat before_all before_store

# ---- HTTP at a fixed rate -------------------------------------------------

log "HTTP: $RATE req/s, $CONNS connections, ${ROUND_SECS}s per round"
for r in $(seq 1 "$ROUNDS"); do
  for s in $(order "$r" $HTTP_SYSTEMS); do
    measure "$s" "$pid_redis" "$work/loadgen" -url "${url[$s]}" $(tls_args "$s" "") -body "$body" -users "$USERS" -rate "$RATE" \
      -duration "${ROUND_SECS}s" -warmup 1s -conns "$CONNS"
    [ "$(field non2xx)" = 0 ] || { echo "$out" >&2; die "$s: non-2xx answers at $RATE/s"; }
    [ "$(field errors)" = 0 ] || log "warning: $s: $(field errors) transport errors ($(echo "$out" | grep -m1 '^first error'))"
    n=$(awk -v q="$(field requests)" -v r="$RATE" 'BEGIN { print q + r }') # the warm-up second included
    cpu[$s]="${cpu[$s]:-} $(per "$ticks_server" "$n")"
    case $s in *redis*) rcpu[$s]="${rcpu[$s]:-} $(per "$ticks_redis" "$n")" ;; esac
    lat50[$s]="${lat50[$s]:-} $(field p50_us)" lat99[$s]="${lat99[$s]:-} $(field p99_us)"
    rlast=none
    [ -z "${rcpu[$s]:-}" ] || rlast="${rcpu[$s]##* } us"
    log "round $r $s: achieved $(field achieved)/s, CPU per request ${cpu[$s]##* } us (redis-server $rlast), p50 $(field p50_us) us, p99 $(field p99_us) us"
  done
done

# ---- gRPC at saturation ---------------------------------------------------

log "gRPC: saturation, $RLS_STREAMS streams over $RLS_CONNS connections, ${ROUND_SECS}s per round"
for s in rls_sluice rls_sluice_tls; do before_all[$s]=$(checks "$s") before_store[$s]=$(store_checks "$s"); done
for r in $(seq 1 "$ROUNDS"); do
  for s in $(order "$r" $RLS_SYSTEMS); do
    measure "$s" "$pid_redis" rlsload "$s" -rate 0 -duration "${ROUND_SECS}s" -conns "$RLS_CONNS" -streams "$RLS_STREAMS"
    [ "$(field over_limit)" = 0 ] && [ "$(field errors)" = 0 ] || { echo "$out" >&2; die "$s: not every answer was OK"; }
    n=$(field all_calls)
    cpu[$s]="${cpu[$s]:-} $(per "$ticks_server" "$n")" rcpu[$s]="${rcpu[$s]:-} $(per "$ticks_redis" "$n")"
    gcpu[$s]="${gcpu[$s]:-} $(per "$ticks_loadgen" "$n")" sat[$s]="${sat[$s]:-} $(field achieved)"
    log "round $r $s: $(field achieved) calls/s, CPU per call ${cpu[$s]##* } us, Redis's ${rcpu[$s]##* } us, rlsload's ${gcpu[$s]##* } us"
  done
done
declare -A satm
for s in $RLS_SYSTEMS; do satm[$s]=$(echo "${sat[$s]}" | median); done
for s in rls_sluice rls_sluice_tls; do
  all=$(($(checks "$s") - before_all[$s])); store=$(($(store_checks "$s") - before_store[$s]))
  [ "$all" -gt 0 ] || die "$s counted no checks in /metrics"
  log "$s: $store of $all checks decided by Redis"
  satm[$s]=$(awk -v v="${satm[$s]}" -v a="$store" -v b="$all" 'BEGIN { printf "%.2f", v * a / b }')
done

# ---- report ---------------------------------------------------------------

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "---- peers_tls: HTTP CPU per request at $RATE/s (loadgen) and gRPC saturation (rlsload), plaintext and TLS, median of $ROUNDS x ${ROUND_SECS}s; load average $load_before before, $load_after after ----"
declare -A tot
for s in $HTTP_SYSTEMS $RLS_SYSTEMS; do
  d=$(echo "${cpu[$s]}" | median) rd=0
  [ -z "${rcpu[$s]:-}" ] || rd=$(echo "${rcpu[$s]}" | median)
  tot[$s]=$(awk -v a="$d" -v b="$rd" 'BEGIN { printf "%.2f", a + b }')
  printf 'BENCH peers_tls_%s_cpu_us_per_request %s us\n' "$s" "$d"
  [ -z "${rcpu[$s]:-}" ] || printf 'BENCH peers_tls_%s_redis_cpu_us_per_request %s us\n' "$s" "$rd"
  if [ -n "${lat50[$s]:-}" ]; then
    printf 'BENCH peers_tls_%s_p50_us_at_fixed_rate %s us\n' "$s" "$(echo "${lat50[$s]}" | median)"
    printf 'BENCH peers_tls_%s_p99_us_at_fixed_rate %s us\n' "$s" "$(echo "${lat99[$s]}" | median)"
  else
    printf 'BENCH peers_tls_%s_rps %s req/s\n' "$s" "${satm[$s]}"
    printf 'BENCH peers_tls_%s_rlsload_cpu_us_per_request %s us\n' "$s" "$(echo "${gcpu[$s]}" | median)"
  fi
done
# The cost of TLS: the server's CPU per request on TLS less that in plaintext.
for s in sluice_memory sluice_redis rls_sluice rls_envoy_ratelimit; do
  d=$(echo "${cpu[$s]}" | median) t=$(echo "${cpu[${s}_tls]}" | median)
  awk -v n="$s" -v d="$d" -v t="$t" 'BEGIN { printf "BENCH peers_tls_%s_tls_cost_cpu_us_per_request %.2f us\n", n, t - d }'
done
ratio() { awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN { if (b > 0) printf "BENCH peers_tls_%s %.3f ratio\n", n, a / b }'; }
ratio rls_sluice_over_envoy_ratelimit "${satm[rls_sluice]}" "${satm[rls_envoy_ratelimit]}"
ratio rls_sluice_tls_over_envoy_ratelimit_tls "${satm[rls_sluice_tls]}" "${satm[rls_envoy_ratelimit_tls]}"
# How many times less CPU (server and Redis) Sluice spends on a call.
ratio rls_cpu_envoy_ratelimit_over_sluice "${tot[rls_envoy_ratelimit]}" "${tot[rls_sluice]}"
ratio rls_cpu_envoy_ratelimit_tls_over_sluice_tls "${tot[rls_envoy_ratelimit_tls]}" "${tot[rls_sluice_tls]}"
