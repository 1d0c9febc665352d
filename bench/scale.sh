#!/usr/bin/env bash
# make bench-scale: what a decision costs as the deployment grows. K Sluice
# daemons on a Redis Cluster of M primaries, all on this machine, driven at
# saturation by wrk (closed loop, CONNS connections split over the
# daemons, USERS subjects in turn, one token bucket policy that admits
# every request). For each M x K it reads every daemon's and every
# redis-server's CPU time from /proc before and after the round and the
# daemons' /metrics, and prints one line:
#
#   SCALE M=3 K=2 checks=... store_share=0.99990 breaker_opens=0
#     decisions_per_daemon_cpu_s=... decisions_per_redis_cpu_s=...
#     redis_us_per_decision=... daemon_us_per_decision=...
#     daemon_sleeps_per_decision=...
#     checks_per_script_call=... redis_sleeps_per_script_call=...
#     p99_ms=... single_redis_us_per_decision=... single_p99_ms=...
#
# Only decisions Redis made count (sluice_checks_total{source="store"});
# breaker opens are reported. Efficiency per CPU-second, unlike
# throughput, hardly moves when other work shares the machine, and it is
# what extrapolates: a figure that stays flat as M and K grow says the
# cost per decision does not depend on them. The single server (the
# merged script call per batch) is the reference the Cluster's Redis CPU
# per decision is compared with: each Cluster round is paired with a
# round on it just before, and the BENCH line per M is the median over K
# of the ratio within each pair. The script calls and the sleeps of each
# redis-server's event loop per call say why a Cluster costs more; the
# platform line first says what waking a sleeping server costs here, and
# the daemons' threads' sleeps per decision say as much of the daemons.
#
# Then, unless OPEN_FRACTION=0, each pair again open loop (bench/loadgen,
# requests due at a fixed rate whatever the answers) at OPEN_FRACTION (0.5)
# of the single server's saturation with as many daemons: a deployment
# runs below saturation, where fewer checks meet in a batch and a server
# finds no call waiting more often. Those lines start "SCALE open" and
# give rate=, loadgen_errors= (errors, non-2xx and unsent requests) and
# p99_ms from each request's due time, and lag_p99_ms, how late the
# generator sent; their BENCH lines are
# scale_mM_open_redis_cpu_over_single.
#
# Last, with RESHARD=1 (default), a slot migration under load on M=3, K=2:
# redis-cli --cluster reshard moves RESHARD_SLOTS slots from the first
# primary to the second while wrk runs; the line RESHARD reports wrk's
# non-2xx answers and socket errors (both must be 0) and the store share.
#
# Knobs (environment): MS ("1 3 6"), KS ("1 2 4"), SECS (8), CONNS (50),
# WRK_THREADS (2), USERS (10000), OPEN_FRACTION (0.5), RESHARD (1),
# RESHARD_SLOTS (2000), SLUICE_FLAGS (more flags for sluice serve).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=bench-scale
TOOLS=${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}
# shellcheck source=bench/lib.sh
. bench/lib.sh

MS=${MS:-"1 3 6"}
KS=${KS:-"1 2 4"}
SECS=${SECS:-8}
CONNS=${CONNS:-50}
WRK_THREADS=${WRK_THREADS:-2}
USERS=${USERS:-10000}
OPEN_FRACTION=${OPEN_FRACTION:-0.5}
RESHARD=${RESHARD:-1}
RESHARD_SLOTS=${RESHARD_SLOTS:-2000}

for t in redis-server redis-cli redis-benchmark wrk curl; do
  command -v "$t" >/dev/null || die "$t is not installed (on Debian: apt-get install -y redis-server redis-tools wrk curl)"
done
go build -o "$work/sluice" ./cmd/sluice
go build -o "$work/loadgen" ./bench/loadgen
ticks=$(getconf CLK_TCK)

cat >"$work/policies.json" <<'EOF'
[{"id": "scale", "match": {"routes": ["/bench"]}, "algorithm": "token_bucket",
  "rate_per_sec": 1000, "burst": 1000, "mode": "enforce",
  "description": "the scale harness: 1000/s per user, every request allowed"}]
EOF
body='{"user":"{user}","route":"/bench"}'

# cluster_up M: M empty primaries joined into one cluster, the 16384 slots
# split evenly, every node agreeing (cluster_state:ok) within 30 s. Sets
# redis_ports and store. M=1 is a one-primary cluster, which redis-cli
# --cluster create refuses, so the slots are assigned by hand for every M.
cluster_up() {
  local m=$1 i p first lo hi
  redis_ports=()
  for i in $(seq 1 "$m"); do
    p=$(cluster_port)
    redis_up "redis_$p" "$p" --dir "$work" --cluster-enabled yes --cluster-config-file "nodes-$p.conf" --cluster-node-timeout 5000
    redis_ports+=("$p")
  done
  first=${redis_ports[0]}
  for p in "${redis_ports[@]:1}"; do redis-cli -p "$p" cluster meet 127.0.0.1 "$first" >/dev/null; done
  for i in $(seq 0 $((m - 1))); do
    lo=$((16384 * i / m)); hi=$((16384 * (i + 1) / m - 1))
    redis-cli -p "${redis_ports[$i]}" cluster addslotsrange "$lo" "$hi" >/dev/null
  done
  local deadline=$((SECONDS + 30))
  for p in "${redis_ports[@]}"; do
    until redis-cli -p "$p" cluster info | grep -q 'cluster_state:ok' &&
      [ "$(redis-cli -p "$p" cluster nodes | grep -c master)" -eq "$m" ]; do
      [ $SECONDS -lt $deadline ] || die "cluster of $m did not settle"
      sleep 0.2
    done
  done
  store="redis-cluster://$(printf '127.0.0.1:%s,' "${redis_ports[@]}" | sed 's/,$//')"
}

# daemons_up K: K daemons on $store; sets daemon_ports and daemon_pids.
daemons_up() {
  local k=$1 i port pid
  daemon_ports=(); daemon_pids=()
  for i in $(seq 1 "$k"); do
    port=$(freeport)
    # shellcheck disable=SC2086
    start "sluice_$port" "$work/sluice" serve --listen "127.0.0.1:$port" --policies "$work/policies.json" \
      --log-level warn --store "$store" ${SLUICE_FLAGS:-}
    pid=$(eval echo "\$pid_sluice_$port")
    daemon_ports+=("$port"); daemon_pids+=("$pid")
  done
  for port in "${daemon_ports[@]}"; do
    local deadline=$((SECONDS + 30)) answer=""
    # A daemon that has just started may decide its first checks by the
    # fallback while its connections open: ready when the store decides.
    until [[ "$answer" == *'"source":"store"'* ]]; do
      [ $SECONDS -lt $deadline ] || die "daemon on $port: no decision by the store within 30 s ($answer)"
      answer=$(curl -sS -X POST -H 'Content-Type: application/json' -d '{"user":"probe","route":"/bench"}' \
        "http://127.0.0.1:$port/v1/check" 2>/dev/null || true)
      sleep 0.2
    done
  done
}

sum_metric() { local s=0 p; for p in "${daemon_ports[@]}"; do s=$((s + $(metric_at "$p" "$1"))); done; echo "$s"; }
redis_pids() { local p; for p in "${redis_ports[@]}"; do eval echo "\$pid_redis_$p"; done; }
# sleeps PID...: the times the processes' main threads went to sleep
# (voluntary context switches); a redis-server's main thread runs its
# event loop, and sleeps when it finds no call waiting.
sleeps() { local p s=0; for p in "$@"; do s=$((s + $(awk '/^voluntary_ctxt_switches:/ { print $2 }' "/proc/$p/status"))); done; echo "$s"; }
# thread_sleeps PID...: the same, summed over every thread of the
# processes (a daemon's Go runtime parks its threads when they run out of
# work). Threads that ended meanwhile are not counted.
thread_sleeps() {
  local p
  for p in "$@"; do cat /proc/"$p"/task/*/status 2>/dev/null; done |
    awk '/^voluntary_ctxt_switches:/ { s += $2 } END { print s + 0 }'
}
# script_calls: the script calls (EVAL and EVALSHA) every primary has run.
script_calls() {
  local p s=0 n
  for p in "${redis_ports[@]}"; do
    n=$(redis-cli -p "$p" info commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_eval(sha)?:/ { n += $3 } END { print n + 0 }')
    s=$((s + n))
  done
  echo "$s"
}

# wrk_errors: the non-2xx answers and socket errors of the last load's
# wrk runs, summed.
wrk_errors() { cat "$work"/load.* | awk '/Non-2xx or 3xx responses:/ { n += $NF } /Socket errors:/ { n += 1 } END { print n + 0 }'; }

# loadgen_worst FIELD: the largest FIELD (in µs) of the last load's
# loadgen RESULT lines, in milliseconds.
loadgen_worst() {
  cat "$work"/load.* | awk -v f="$1" '/^RESULT/ { for (i = 2; i <= NF; i++) { split($i, a, "="); if (a[1] == f && a[2] + 0 > m) m = a[2] } } END { printf "%.2f", m / 1000 }'
}

# load SECS [RATE]: wrk against every daemon at once, CONNS split between
# them, or with RATE bench/loadgen open loop at RATE requests a second in
# all, split as evenly; sets bad (wrk's non-2xx answers and socket errors,
# or loadgen's errors, non-2xx and unsent requests, summed), bad_name,
# p99, the worst daemon's p99 latency in milliseconds, and lag, loadgen's
# worst p99 lag as a field of the line ("" for wrk).
load() {
  local secs=$1 rate=${2:-} k=${#daemon_ports[@]} port c outs=() i p
  c=$(( (CONNS + k - 1) / k ))
  rm -f "$work"/load.* # a round with more daemons before left more files
  i=0
  for port in "${daemon_ports[@]}"; do
    if [ -n "$rate" ]; then
      "$work/loadgen" -url "http://127.0.0.1:$port/v1/check" -body "$body" -users "$USERS" \
        -rate $(( (rate + k - 1) / k )) -conns "$c" -duration "${secs}s" -warmup 0s >"$work/load.$i" 2>&1 &
    else
      wrk -t "$WRK_THREADS" -c "$c" -d "${secs}s" --latency -s bench/rotate.lua "http://127.0.0.1:$port/v1/check" \
        -- POST "$USERS" "$body" >"$work/load.$i" 2>&1 &
    fi
    outs+=($!); i=$((i + 1))
  done
  for p in "${outs[@]}"; do wait "$p" || die "load failed: $(cat "$work"/load.*)"; done
  if [ -n "$rate" ]; then
    bad_name=loadgen_errors
    bad=$(cat "$work"/load.* | awk '/^RESULT/ { for (i = 2; i <= NF; i++) if ($i ~ /^(errors|non2xx|unsent)=/) { split($i, a, "="); n += a[2] } } END { print n + 0 }')
    p99=$(loadgen_worst p99_us)
    # How late the generator sent: where it is late too, the machine
    # ran out of CPU for it as well, and the rate is near what it
    # sustains with the generator beside it.
    lag=" lag_p99_ms=$(loadgen_worst lag_p99_us)"
    return
  fi
  bad_name=wrk_errors lag=""
  bad=$(wrk_errors)
  p99=$(cat "$work"/load.* | awk '$1 == "99%" {
      v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v)
      ms = v * (u == "us" ? 0.001 : u == "s" ? 1000 : 1); if (ms > m) m = ms
    } END { printf "%.2f", m }')
}

# round LABEL K [RATE]: one measured round on $store with K daemons, at
# saturation or open loop at RATE; sets redis_us, Redis's CPU per
# decision, and per_s, the checks a second.
round() {
  local label=$1 k=$2 rate=${3:-}
  daemons_up "$k"
  mapfile -t rp < <(redis_pids)
  local all0 store0 opens0 dt0 rt0 all store opens dt rt
  all0=$(sum_metric 'sluice_checks_total{'); store0=$(sum_metric 'sluice_checks_total{decision="allowed",source="store"}')
  opens0=$(sum_metric 'sluice_breaker_opens_total'); dt0=$(sum_ticks "${daemon_pids[@]}"); rt0=$(sum_ticks "${rp[@]}")
  local calls0 calls sleeps0 slept dsleeps0 dslept
  calls0=$(script_calls); sleeps0=$(sleeps "${rp[@]}"); dsleeps0=$(thread_sleeps "${daemon_pids[@]}")
  load "$SECS" "$rate"
  calls=$(( $(script_calls) - calls0 )); slept=$(( $(sleeps "${rp[@]}") - sleeps0 ))
  dslept=$(( $(thread_sleeps "${daemon_pids[@]}") - dsleeps0 ))
  all=$(( $(sum_metric 'sluice_checks_total{') - all0 ))
  store=$(( $(sum_metric 'sluice_checks_total{decision="allowed",source="store"}') - store0 ))
  opens=$(( $(sum_metric 'sluice_breaker_opens_total') - opens0 ))
  dt=$(( $(sum_ticks "${daemon_pids[@]}") - dt0 )); rt=$(( $(sum_ticks "${rp[@]}") - rt0 ))
  [ "$all" -gt 0 ] || die "$label: no checks counted"
  redis_us=$(awk -v st="$store" -v rt="$rt" -v hz="$ticks" 'BEGIN { printf "%.2f", rt / hz * 1e6 / st }')
  per_s=$((all / SECS))
  awk -v l="$label${rate:+ rate=$rate}" -v all="$all" -v st="$store" -v op="$opens" -v dt="$dt" -v rt="$rt" -v hz="$ticks" \
    -v bad="$bad" -v bn="$bad_name" -v secs="$SECS" -v calls="$calls" -v slept="$slept" -v dslept="$dslept" -v p99="$p99" -v ref="$lag${ref:-}" -v ru="$redis_us" 'BEGIN {
      ds = dt / hz; rs = rt / hz
      printf "SCALE %s checks=%d per_s=%.0f store_share=%.5f breaker_opens=%d %s=%d", l, all, all / secs, st / all, op, bn, bad
      printf " decisions_per_daemon_cpu_s=%.0f decisions_per_redis_cpu_s=%.0f", st / ds, st / rs
      printf " daemon_us_per_decision=%.1f redis_us_per_decision=%.1f", ds * 1e6 / st, ru
      printf " daemon_sleeps_per_decision=%.2f", dslept / st
      printf " checks_per_script_call=%.1f redis_sleeps_per_script_call=%.2f p99_ms=%.2f%s\n", (calls > 0 ? all / calls : 0), (calls > 0 ? slept / calls : 0), p99, ref
    }'
  stop_pids "${daemon_pids[@]}"
}

# paired LABEL K [RATE]: a round on the single server, then one on the
# Cluster ($store), each with K daemons, back to back: the Cluster's line
# gives the single server's Redis CPU per decision of the round before it
# and the ratio, so that whatever else the machine ran moved both alike.
# Appends "LABEL ratio" to ratios, or with RATE to open_ratios.
paired() {
  local label=$1 k=$2 rate=${3:-} cstore=$store cports=("${redis_ports[@]}") single_us r
  store=$single_store; redis_ports=("$single")
  ref="" round "ref $label" "$k" "$rate" >/dev/null
  single_us=$redis_us
  store=$cstore; redis_ports=("${cports[@]}")
  ref=" single_redis_us_per_decision=$single_us single_p99_ms=$p99" round "${rate:+open }$label" "$k" "$rate"
  r="$label $(awk -v c="$redis_us" -v s="$single_us" 'BEGIN { printf "%.3f", c / s }')"
  if [ -n "$rate" ]; then open_ratios+=("$r"); else ratios+=("$r"); fi
}

# The single-server reference: the merged script call per batch. It runs
# to the end, since every Cluster round is paired with one of its own.
single=$(freeport); redis_up "redis_$single" "$single" --dir "$work"; redis_ports=("$single")
single_store="redis://127.0.0.1:$single"; store=$single_store

# What a call costs Redis on this machine beside what it carries: the CPU
# of a PING from one client, answered and waited for in turn, so that the
# server sleeps between calls, and from ten at once, so that it finds the
# next call waiting. The difference is the cost of waking a server that
# went idle; a Cluster's primaries each see a share of the calls and
# sleep between more of them than a single server does.
ping_cpu() {
  local c=$1 n=20000 a b
  a=$(redis_cpu_us "$single"); redis-benchmark -p "$single" -c "$c" -n "$n" -q -t ping_mbulk >/dev/null
  b=$(redis_cpu_us "$single")
  awk -v a="$a" -v b="$b" -v n="$n" 'BEGIN { printf "%.1f", (b - a) / n }'
}
redis_cpu_us() { redis-cli -p "$1" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.0f", s * 1e6 }'; }
echo "SCALE platform redis_cpu_us_per_ping_one_client=$(ping_cpu 1) redis_cpu_us_per_ping_ten_clients=$(ping_cpu 10)"
# The open-loop rate with K daemons: OPEN_FRACTION of the single server's
# saturation with as many.
declare -A open_rate
for k in $KS; do
  round "M=single K=$k" "$k"
  open_rate[$k]=$(awk -v r="$per_s" -v f="$OPEN_FRACTION" 'BEGIN { printf "%d", r * f }')
done

ratios=(); open_ratios=()
for m in $MS; do
  cluster_up "$m"
  for k in $KS; do
    paired "M=$m K=$k" "$k"
    [ "${open_rate[$k]}" -eq 0 ] || paired "M=$m K=$k" "$k" "${open_rate[$k]}"
  done
  if [ "$RESHARD" = 1 ] && [ "$m" = 3 ]; then
    daemons_up 2
    from=$(redis-cli -p "${redis_ports[0]}" cluster myid); to=$(redis-cli -p "${redis_ports[1]}" cluster myid)
    all0=$(sum_metric 'sluice_checks_total{'); store0=$(sum_metric 'sluice_checks_total{decision="allowed",source="store"}')
    load $((SECS * 2)) &
    loader=$!
    sleep 1
    redis-cli --cluster reshard "127.0.0.1:${redis_ports[0]}" --cluster-from "$from" --cluster-to "$to" \
      --cluster-slots "$RESHARD_SLOTS" --cluster-yes >"$work/reshard.log" 2>&1 || die "reshard failed: $(tail -5 "$work/reshard.log")"
    wait "$loader"
    wrk_bad=$(wrk_errors)
    all=$(( $(sum_metric 'sluice_checks_total{') - all0 ))
    store=$(( $(sum_metric 'sluice_checks_total{decision="allowed",source="store"}') - store0 ))
    awk -v all="$all" -v st="$store" -v bad="$wrk_bad" -v n="$RESHARD_SLOTS" 'BEGIN {
      printf "RESHARD M=3 K=2 slots_moved=%d checks=%d store_share=%.5f wrk_errors=%d\n", n, all, st / all, bad }'
    stop_pids "${daemon_pids[@]}"
  fi
  mapfile -t rp < <(redis_pids)
  stop_pids "${rp[@]}"
done

# medians NAME RATIO...: per M, the median over K of the Cluster's Redis
# CPU per decision over the single server's in the round before it, as
# BENCH scale_mM_NAME lines.
medians() {
  local name=$1; shift
  [ $# -gt 0 ] || return 0
  printf '%s\n' "$@" | awk -v name="$name" '{ split($1, a, "="); r[a[2]] = r[a[2]] " " $3 }
END {
  for (m in r) {
    n = split(substr(r[m], 2), v, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    printf "BENCH scale_m%s_%s %.3f ratio (median of %d K)\n", m, name, (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2), n
  }
}' | sort
}
medians redis_cpu_over_single "${ratios[@]}"
medians open_redis_cpu_over_single "${open_ratios[@]}"
