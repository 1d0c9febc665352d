#!/usr/bin/env bash
# The gRPC peer comparison: Sluice's rate limit service against
# envoyproxy/ratelimit's, both answering
# envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit on loopback,
# on one redis-server, from the same envoyproxy/ratelimit configuration file,
# under the same load in the same run. bench/peers.sh runs it last; it runs
# alone too. See bench/README.md.
#
# Systems (RLS_SYSTEMS):
#   sluice_redis     sluice serve --rls-listen --envoy-config FILE, Redis
#                    store on database 1
#   envoy_ratelimit  envoyproxy/ratelimit, GRPC_PORT, Redis backend on
#                    database 0 (its defaults kept, as in bench/peers.sh)
#   sluice_cluster   sluice serve --envoy-config FILE on a Redis Cluster of
#                    three primaries (redis-cluster://, so each descriptor
#                    has a slot of its own)
#   envoy_cluster    envoyproxy/ratelimit in its cluster mode
#                    (REDIS_TYPE=cluster) on the same Cluster
#   sluice_grpc      (not by default) sluice_redis served by grpc-go tuned
#                    instead of its own HTTP/2 transport (--rls-transport
#                    grpc, built with -tags vtprotobuf), Redis database 2:
#                    RLS_SYSTEMS="sluice_redis sluice_grpc" compares the
#                    two transports
# The four run interleaved in the same rounds; the Cluster is started only
# when a cluster system is asked for. All load one file: domain bench, a descriptor user with LIMIT (1000)
# requests per second, which Sluice decides with envoyproxy/ratelimit's own
# fixed window. Each call names one of USERS (10 000) users in turn
# (user=u<i>), so no user nears its limit: every answer must be OK, and the
# script fails on an OVER_LIMIT or an error during saturation.
#
# The load comes from bench/rlsload with its own lean HTTP/2 client
# (RLS_CLIENT=h2, the default): on a machine of few cores the generator
# shares the CPU with both servers, and grpc-go's client, which spends per
# call about what a server does, would compress every ratio toward 1, as a
# heavy HTTP client would where wrk is used. Both systems get the same
# requests with the same headers; RLS_CLIENT=grpc drives them with
# grpc-go's client instead. The generator's own CPU time per call is
# printed beside the servers'.
#
# Phases, interleaved round by round (the order reversed every other round):
#   1. saturation: bench/rlsload, closed loop, RLS_STREAMS calls in flight
#      over RLS_CONNS connections, ROUNDS x ROUND_SECS per system; the
#      figure is the median round. Sluice counts only what Redis decided:
#      its throughput is multiplied by the share of sluice_checks_total
#      whose source was the store, read from /metrics before and after.
#      Beside it, the CPU time per call of the system's process and of
#      redis-server during its rounds (from /proc, warm-up included): a
#      figure that neighbours on the machine disturb less than throughput;
#   2. fixed rate: bench/rlsload, open loop at RLS_RATE calls/s (default
#      RATE_FRACTION, 0.7, of the slower system's saturation figure),
#      latency from each call's due time; p50 and p99 are the median over
#      the rounds.
#
# Knobs (environment): ROUNDS (3), ROUND_SECS (10), FIXED_SECS (ROUND_SECS),
# USERS (10000), LIMIT (1000), RLS_CONNS (4), RLS_STREAMS (50), RLS_RATE
# (auto), RATE_FRACTION (0.7), RLS_SYSTEMS (the first four, in the order
# above; "sluice_redis envoy_ratelimit" leaves the Cluster out),
# SLUICE_REDIS_FLAGS (more flags for sluice serve), SLUICE_TOOLS (cache of
# the peers' binaries, default ~/.cache/sluice-tools). Prints
# `BENCH peers_rls_<name> <value> <unit>` lines last.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
ROUND_SECS=${ROUND_SECS:-10}
FIXED_SECS=${FIXED_SECS:-$ROUND_SECS}
USERS=${USERS:-10000}
LIMIT=${LIMIT:-1000}
RLS_CONNS=${RLS_CONNS:-4}
RLS_STREAMS=${RLS_STREAMS:-50}
RLS_RATE=${RLS_RATE:-auto}
RATE_FRACTION=${RATE_FRACTION:-0.7}
RLS_CLIENT=${RLS_CLIENT:-h2}
RLS_SYSTEMS=${RLS_SYSTEMS:-"sluice_redis envoy_ratelimit sluice_cluster envoy_cluster"}
TOOLS=${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}

BENCH_NAME=peers_rls
. bench/lib.sh

for tool in go redis-server redis-cli curl; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done

# ---- build ----------------------------------------------------------------

install_ratelimit
log "building sluice, bench/rlsload"
go build -o "$work/sluice" ./cmd/sluice
if [[ " $RLS_SYSTEMS " == *" sluice_grpc "* ]]; then
  go build -tags vtprotobuf -o "$work/sluice-vtproto" ./cmd/sluice
fi
go build -o "$work/rlsload" ./bench/rlsload

# ---- start ----------------------------------------------------------------

start_redis

# start_cluster: three redis-server primaries in cluster mode, the 16384
# slots split between them by redis-cli --cluster create, answering
# cluster_state:ok within 30 s; their ports in cluster_ports, pids in
# pid_cluster1..3.
start_cluster() {
  local i p deadline
  cluster_ports=()
  for i in 1 2 3; do
    p=$(cluster_port)
    mkdir -p "$work/cluster$i"
    redis_up "cluster$i" "$p" --cluster-enabled yes --cluster-config-file "$work/cluster$i/nodes.conf" --dir "$work/cluster$i"
    cluster_ports+=("$p")
  done
  redis-cli --cluster create $(for p in "${cluster_ports[@]}"; do echo "127.0.0.1:$p"; done) --cluster-replicas 0 --cluster-yes \
    >"$work/cluster-create.log" 2>&1 || { cat "$work/cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
  deadline=$((SECONDS + 30))
  for p in "${cluster_ports[@]}"; do
    until redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; do
      [ $SECONDS -lt $deadline ] || die "the Cluster did not reach cluster_state:ok within 30 s"
      sleep 0.2
    done
  done
  cluster_addrs=$(for p in "${cluster_ports[@]}"; do echo "127.0.0.1:$p"; done | paste -sd,)
  log "Redis Cluster of three primaries at $cluster_addrs"
}
cluster_systems=0
case " $RLS_SYSTEMS " in *" sluice_cluster "* | *" envoy_cluster "*) cluster_systems=1 ;; esac
[ "$cluster_systems" = 0 ] || start_cluster

# envoyproxy/ratelimit and Sluice load the same file.
write_envoy_config "$LIMIT"

echo '[]' >"$work/policies.json" # no policies but the file's
sh_port=$(freeport); sg_port=$(freeport)
start sluice_redis "$work/sluice" serve --listen "127.0.0.1:$sh_port" --rls-listen "127.0.0.1:$sg_port" \
  --policies "$work/policies.json" --envoy-config "$envoy_config" --log-level warn \
  --store "redis://127.0.0.1:$redis_port/1" ${SLUICE_REDIS_FLAGS:-}
if [[ " $RLS_SYSTEMS " == *" sluice_grpc "* ]]; then
  th_port=$(freeport); tg_port=$(freeport)
  start sluice_grpc "$work/sluice-vtproto" serve --listen "127.0.0.1:$th_port" --rls-listen "127.0.0.1:$tg_port" \
    --rls-transport grpc --policies "$work/policies.json" --envoy-config "$envoy_config" --log-level warn \
    --store "redis://127.0.0.1:$redis_port/2" ${SLUICE_REDIS_FLAGS:-}
fi
start_envoy_ratelimit envoy_ratelimit REDIS_URL="127.0.0.1:$redis_port"
rg_port=$envoy_grpc_port

declare -A addr hport
addr[sluice_redis]="127.0.0.1:$sg_port" hport[sluice_redis]=$sh_port
addr[envoy_ratelimit]="127.0.0.1:$rg_port"
if [ "$cluster_systems" = 1 ]; then
  ch_port=$(freeport); cg_port=$(freeport)
  start sluice_cluster "$work/sluice" serve --listen "127.0.0.1:$ch_port" --rls-listen "127.0.0.1:$cg_port" \
    --policies "$work/policies.json" --envoy-config "$envoy_config" --log-level warn \
    --store "redis-cluster://$cluster_addrs" ${SLUICE_REDIS_FLAGS:-}
  start_envoy_ratelimit envoy_cluster REDIS_TYPE=cluster REDIS_URL="$cluster_addrs"
  eg_port=$envoy_grpc_port
  addr[sluice_cluster]="127.0.0.1:$cg_port" hport[sluice_cluster]=$ch_port
  addr[envoy_cluster]="127.0.0.1:$eg_port"
fi
# redis_pids SYSTEM: the pids of the Redis that SYSTEM uses (the three
# Cluster nodes for a cluster system).
redis_pids() {
  case $1 in
  *_cluster) echo "$pid_cluster1 $pid_cluster2 $pid_cluster3" ;;
  *) echo "$pid_redis" ;;
  esac
}
if [ -n "${tg_port:-}" ]; then addr[sluice_grpc]="127.0.0.1:$tg_port" hport[sluice_grpc]=$th_port; fi

# rlsload SYSTEM ARGS...: bench/rlsload against SYSTEM with the run's descriptors.
rlsload() {
  local s=$1; shift
  "$work/rlsload" -client "$RLS_CLIENT" -addr "${addr[$s]}" -domain bench -entries 'user={user}' -users "$USERS" "$@" 2>&1
}

# On a Sluice system S (sluice_redis, sluice_grpc, sluice_cluster): a metric's value, 0 if
# absent.
metric() { metric_at "${hport[$1]}" "$2"; }
checks() { metric "$1" 'sluice_checks_total{'; }
store_checks() { metric "$1" 'sluice_checks_total{decision="allowed",source="store"}'; }
breaker_opens() { metric "$1" 'sluice_breaker_opens_total'; }
# The Sluice systems of the run.
sluices=$(for s in $RLS_SYSTEMS; do if [ -n "${hport[$s]:-}" ]; then echo "$s"; fi; done)

for s in $RLS_SYSTEMS; do
  [ -n "${addr[$s]:-}" ] || die "unknown system $s (want some of: ${!addr[*]})"
  # Ready when one call is answered OK, and for Sluice once one was
  # decided by Redis (on a busy machine the first may not be).
  wait_until "$s" "answer OK on ${addr[$s]}" rls_answers "${hport[$s]:-}" rlsload "$s"
  log "$s ready at ${addr[$s]}"
done
for s in $sluices; do
  [ "$(store_checks "$s")" -gt 0 ] || die "$s: its first checks were not decided by Redis"
done

# ---- saturation -----------------------------------------------------------

declare -A sat lat50 lat99 satm cpu rcpu gcpu before_all before_store before_opens fixed_all fixed_store
tck=$(getconf CLK_TCK)
# per_call TICKS: microseconds of CPU per call of the run in $res.
per_call() { awk -v d="$1" -v n="$(field all_calls)" -v t="$tck" 'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }'; }
for s in $sluices; do before_all[$s]=$(checks "$s") before_store[$s]=$(store_checks "$s") before_opens[$s]=$(breaker_opens "$s"); done
for r in $(seq 1 "$ROUNDS"); do
  for s in $(order "$r" $RLS_SYSTEMS); do
    measure "$s" "$(redis_pids "$s")" rlsload "$s" -rate 0 -duration "${ROUND_SECS}s" -conns "$RLS_CONNS" -streams "$RLS_STREAMS"
    cpu[$s]="${cpu[$s]:-} $(per_call "$ticks_server")"
    rcpu[$s]="${rcpu[$s]:-} $(per_call "$ticks_redis")"
    gcpu[$s]="${gcpu[$s]:-} $(per_call "$ticks_loadgen")"
    [ "$(field over_limit)" = 0 ] && [ "$(field errors)" = 0 ] ||
      { echo "$out" >&2; die "$s: not every answer was OK"; }
    sat[$s]="${sat[$s]:-} $(field achieved)"
    log "saturation round $r $s: $(field achieved) calls/s (p50 $(field p50_us) us, p99 $(field p99_us) us), CPU per call $(per_call "$ticks_server") us, Redis's $(per_call "$ticks_redis") us, rlsload's $(per_call "$ticks_loadgen") us"
  done
done
for s in $RLS_SYSTEMS; do satm[$s]=$(echo "${sat[$s]}" | median); done

declare -A store_share opens fixed_share
for s in $sluices; do
  all=$(($(checks "$s") - before_all[$s])); store=$(($(store_checks "$s") - before_store[$s])); opens[$s]=$(($(breaker_opens "$s") - before_opens[$s]))
  [ "$all" -gt 0 ] || die "$s counted no checks in /metrics"
  store_share[$s]=$(awk -v a="$store" -v b="$all" 'BEGIN { printf "%.6f", a / b }')
  log "$s: $store of $all checks decided by Redis, ${opens[$s]} breaker opens"
  satm[${s}_total]=${satm[$s]}
  satm[$s]=$(awk -v v="${satm[$s]}" -v s="${store_share[$s]}" 'BEGIN { printf "%.2f", v * s }')
done

# ---- fixed rate -----------------------------------------------------------

if [ "$RLS_RATE" = auto ]; then
  RLS_RATE=$(for s in $RLS_SYSTEMS; do echo "${satm[${s}_total]:-${satm[$s]}}"; done | fixed_rate "$RATE_FRACTION")
fi
log "fixed rate: $RLS_RATE calls/s (RATE_FRACTION $RATE_FRACTION of the slower saturation figure unless RLS_RATE is set)"
for s in $sluices; do fixed_all[$s]=$(checks "$s") fixed_store[$s]=$(store_checks "$s"); done
for r in $(seq 1 "$ROUNDS"); do
  for s in $(order "$r" $RLS_SYSTEMS); do
    out=$(rlsload "$s" -rate "$RLS_RATE" -duration "${FIXED_SECS}s" -conns "$RLS_CONNS" -streams "$RLS_STREAMS") ||
      { echo "$out" >&2; die "rlsload against $s failed"; }
    res=$(echo "$out" | grep '^RESULT')
    [ "$(field over_limit)" = 0 ] || { echo "$out" >&2; die "$s: OVER_LIMIT answers at $RLS_RATE/s"; }
    [ "$(field errors)" = 0 ] || log "warning: $s: $(field errors) errors at $RLS_RATE/s ($(echo "$out" | grep -m1 '^first error'))"
    warn_backlog "$s" "$RLS_RATE"
    lat50[$s]="${lat50[$s]:-} $(field p50_us)"
    lat99[$s]="${lat99[$s]:-} $(field p99_us)"
    log_latencies "$r" "$s"
  done
done
for s in $sluices; do
  all=$(($(checks "$s") - fixed_all[$s])); store=$(($(store_checks "$s") - fixed_store[$s]))
  fixed_share[$s]=$(awk -v a="$store" -v b="$all" 'BEGIN { printf "%.6f", (b > 0 ? a / b : 0) }')
  log "$s at $RLS_RATE/s: $store of $all checks decided by Redis; after the run:"
  curl -fsS "http://127.0.0.1:${hport[$s]}/metrics" | grep -E '^sluice_(checks_total|breaker|store_|degraded|rls_)' >&2 || true
done

# ---- report ---------------------------------------------------------------

echo "---- peers_rls: gRPC ShouldRateLimit, saturation (median of $ROUNDS x ${ROUND_SECS}s, $RLS_STREAMS streams over $RLS_CONNS connections) and p50/p99 at $RLS_RATE/s (open loop) ----"
for s in $RLS_SYSTEMS; do
  printf 'BENCH peers_rls_%s_rps %s req/s\n' "$s" "${satm[$s]}"
  printf 'BENCH peers_rls_%s_p50_us_at_fixed_rate %s us\n' "$s" "$(echo "${lat50[$s]}" | median)"
  printf 'BENCH peers_rls_%s_p99_us_at_fixed_rate %s us\n' "$s" "$(echo "${lat99[$s]}" | median)"
  printf 'BENCH peers_rls_%s_cpu_us_per_call %s us\n' "$s" "$(echo "${cpu[$s]}" | median)"
  printf 'BENCH peers_rls_%s_redis_cpu_us_per_call %s us\n' "$s" "$(echo "${rcpu[$s]}" | median)"
  printf 'BENCH peers_rls_%s_rlsload_cpu_us_per_call %s us\n' "$s" "$(echo "${gcpu[$s]}" | median)"
done
printf 'BENCH peers_rls_fixed_rate %s req/s\n' "$RLS_RATE"
for s in $sluices; do
  printf 'BENCH peers_rls_%s_all_sources_rps %s req/s\n' "$s" "${satm[${s}_total]}"
  printf 'BENCH peers_rls_%s_store_share %s %%\n' "$s" "$(awk -v v="${store_share[$s]}" 'BEGIN { printf "%.3f", v * 100 }')"
  printf 'BENCH peers_rls_%s_breaker_opens %s count\n' "$s" "${opens[$s]}"
  printf 'BENCH peers_rls_%s_store_share_at_fixed_rate %s %%\n' "$s" "$(awk -v v="${fixed_share[$s]}" 'BEGIN { printf "%.3f", v * 100 }')"
done
if [ -n "${satm[sluice_redis]:-}" ] && [ -n "${satm[envoy_ratelimit]:-}" ]; then
  awk -v a="${satm[sluice_redis]}" -v b="${satm[envoy_ratelimit]}" \
    'BEGIN { if (b > 0) printf "BENCH peers_rls_sluice_redis_over_envoy_ratelimit %.3f ratio\n", a / b }'
fi
# The same on the three-primary Cluster: Sluice's RLS over envoyproxy/ratelimit
# in its cluster mode.
if [ -n "${satm[sluice_cluster]:-}" ] && [ -n "${satm[envoy_cluster]:-}" ]; then
  awk -v a="${satm[sluice_cluster]}" -v b="${satm[envoy_cluster]}" \
    'BEGIN { if (b > 0) printf "BENCH peers_rls_sluice_cluster_over_envoy_cluster %.3f ratio\n", a / b }'
fi
# The transports of the service side by side: grpc-go tuned over Sluice's
# own, saturation throughput and latency at the fixed rate.
if [ -n "${satm[sluice_redis]:-}" ] && [ -n "${satm[sluice_grpc]:-}" ]; then
  awk -v a="${satm[sluice_grpc]}" -v b="${satm[sluice_redis]}" \
    'BEGIN { if (b > 0) printf "BENCH peers_rls_sluice_grpc_over_sluice_redis %.3f ratio\n", a / b }'
  awk -v a="$(echo "${lat50[sluice_grpc]}" | median)" -v b="$(echo "${lat50[sluice_redis]}" | median)" \
    'BEGIN { if (b > 0) printf "BENCH peers_rls_sluice_grpc_over_sluice_redis_p50 %.3f ratio\n", a / b }'
  awk -v a="$(echo "${lat99[sluice_grpc]}" | median)" -v b="$(echo "${lat99[sluice_redis]}" | median)" \
    'BEGIN { if (b > 0) printf "BENCH peers_rls_sluice_grpc_over_sluice_redis_p99 %.3f ratio\n", a / b }'
fi
