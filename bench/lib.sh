# shellcheck shell=bash
# Functions shared by the scripts of bench/ that start servers (peers.sh,
# peers_rls.sh, peers_tls.sh, scale.sh); sourced, not run. The sourcing
# script sets BENCH_NAME (the prefix of its log lines) and TOOLS (the cache
# of the peers' binaries) first.

log() { echo "$BENCH_NAME: $*" >&2; }
die() { echo "$BENCH_NAME: $*" >&2; exit 1; }

# The background processes (start) and the scratch directory $work go
# when the script exits.
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-$BENCH_NAME.XXXXXX")
pids=()
cleanup() {
  stop_pids "${pids[@]}"
  rm -rf "$work"
}
trap cleanup EXIT

# stop_pids PID...: kill those processes and wait for them.
stop_pids() {
  local p
  for p in "$@"; do kill "$p" 2>/dev/null || true; done
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
}

# install_tool MODULE/CMD VERSION NAME: go install into $TOOLS/NAME@VERSION
# once; prints the binary's path.
install_tool() {
  local pkg=$1 version=$2 name=$3 dir="$TOOLS/$3@$2"
  local bin="$dir/$(basename "$pkg")"
  if [ ! -x "$bin" ]; then
    log "go install $pkg@$version (once, into $dir)"
    mkdir -p "$dir"
    GOBIN="$dir" GOFLAGS=-buildvcs=false go install "$pkg@$version" >&2 || die "go install $pkg@$version failed"
  fi
  echo "$bin"
}

# envoyproxy/ratelimit, the peer of peers.sh, peers_rls.sh and peers_tls.sh.
# It tags no semver releases: this is the pseudo-version of its main branch
# (2026-01-22) that the Go module proxy serves.
RATELIMIT_MOD=github.com/envoyproxy/ratelimit
RATELIMIT_VERSION=v1.4.1-0.20260122083618-3fb702589d36

# install_ratelimit: envoyproxy/ratelimit's service built once (install_tool),
# its path in ratelimit_bin.
install_ratelimit() {
  ratelimit_bin=$(install_tool "$RATELIMIT_MOD/src/service_cmd" "$RATELIMIT_VERSION" ratelimit)
}

# freeport prints a loopback port nothing listens on, below the kernel's
# ephemeral range (32768 up), where outgoing connections take theirs.
used_ports=" "
freeport() {
  local p
  while :; do
    p=$((15000 + RANDOM % 17000))
    case "$used_ports" in *" $p "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      used_ports="$used_ports$p "
      echo "$p"
      return
    fi
  done
}

# cluster_port prints a port for a Redis Cluster node, free as freeport's
# are, whose cluster bus port (the port + 10000) is free too and below the
# ephemeral range as well: there even a closed client connection's port,
# in TIME_WAIT, keeps the bus from binding it ("Address already in use").
cluster_port() {
  local p
  until p=$(freeport) && [ $((p + 10000)) -lt 32768 ] && ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null; do :; done
  echo "$p"
}

# start NAME CMD...: run in the background, output to $work/NAME.log, its
# pid in $pid_NAME.
start() {
  local name=$1; shift
  "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
}

# redis_up NAME PORT [ARGS...]: a fresh redis-server started as NAME (see
# start) on PORT, with more of its flags in ARGS, answering PING within 20 s.
redis_up() {
  local name=$1 port=$2; shift 2
  start "$name" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no "$@"
  local deadline=$((SECONDS + 20))
  until redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; do
    [ $SECONDS -lt $deadline ] || die "redis-server on $port did not start"
    sleep 0.1
  done
}

# start_redis: a fresh redis-server on $redis_port (pid_redis).
start_redis() {
  redis_port=$(freeport)
  redis_up redis "$redis_port"
}

# envoy_config is the rate limit configuration that envoyproxy/ratelimit
# reads (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml) and that Sluice's
# --envoy-config loads too.
envoy_config=$work/rl/ratelimit/config/bench.yaml

# write_envoy_config LIMIT: writes $envoy_config: domain bench, a descriptor
# user with LIMIT requests per second.
write_envoy_config() {
  mkdir -p "${envoy_config%/*}"
  cat >"$envoy_config" <<EOF
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: $1
EOF
}

# start_envoy_ratelimit NAME ENV...: envoyproxy/ratelimit (install_ratelimit
# first) started as NAME (see start) on $envoy_config, its defaults kept, on
# loopback ports: HTTP on $envoy_http_port, gRPC on $envoy_grpc_port. ENV
# (NAME=value) adds to its environment, REDIS_URL at least.
start_envoy_ratelimit() {
  local name=$1; shift
  envoy_http_port=$(freeport) envoy_grpc_port=$(freeport)
  start "$name" env HOST=127.0.0.1 PORT="$envoy_http_port" GRPC_HOST=127.0.0.1 GRPC_PORT="$envoy_grpc_port" \
    DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(freeport)" USE_STATSD=false LOG_LEVEL=warn \
    RUNTIME_ROOT="$work/rl" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false RUNTIME_IGNOREDOTFILES=true \
    BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp "$@" "$ratelimit_bin"
}

# metric_at PORT NAME_WITH_LABELS: the sum of the series of a daemon's
# /metrics that start with NAME_WITH_LABELS, 0 if none.
metric_at() { curl -fsS "http://127.0.0.1:$1/metrics" | metric_sum "$2"; }

# metric_sum NAME_WITH_LABELS: the same of the /metrics text on standard
# input.
metric_sum() { awk -v m="$1" 'index($0, m) == 1 { v += $NF } END { printf "%.0f\n", v + 0 }'; }

# wait_until NAME WHAT CMD...: runs CMD until it succeeds, every 0.2 s, for
# 20 s at most; dies, NAME's log shown, if NAME's process (see start)
# exits first or with "NAME did not WHAT within 20 s".
wait_until() {
  local name=$1 what=$2; shift 2
  local deadline=$((SECONDS + 20)) pid
  pid=$(eval echo "\$pid_$name")
  until "$@"; do
    kill -0 "$pid" 2>/dev/null || { cat "$work/$name.log" >&2; die "$name exited"; }
    [ $SECONDS -lt $deadline ] || { cat "$work/$name.log" >&2; die "$name did not $what within 20 s"; }
    sleep 0.2
  done
}

# field NAME: NAME=value of the RESULT line of bench/loadgen or
# bench/rlsload in $res.
field() { echo "$res" | tr ' ' '\n' | awk -F= -v k="$1" '$1 == k { print $2 }'; }

# rls_answers GATEWAY_PORT RLSLOAD...: whether one call of RLSLOAD (a
# bench/rlsload command aimed at a rate limit service; the flags of a single
# short call are appended) is answered OK and, for a Sluice (GATEWAY_PORT,
# empty for a peer), whether its store has decided a check yet: one that has
# just started decides its first checks by the fallback while its Redis
# connections open. The RESULT line is left in res.
rls_answers() {
  local gateway=$1; shift
  res=$("$@" -users 1 -conns 1 -streams 1 -duration 100ms -warmup 0 -timeout 1s | grep '^RESULT') &&
    [ "$(field ok)" -gt 0 ] && [ "$(field errors)" = 0 ] &&
    { [ -z "$gateway" ] || [ "$(metric_at "$gateway" 'sluice_checks_total{decision="allowed",source="store"}')" -gt 0 ]; }
}

# fixed_rate FRACTION: FRACTION of the least of the saturation figures on
# standard input, rounded down to a hundred, 100 at least: the offered rate
# of a fixed-rate phase, one that every system keeps up with.
fixed_rate() {
  awk -v v="$(sort -g | head -1)" -v f="$1" 'BEGIN { r = int(v * f / 100) * 100; if (r < 100) r = 100; print r }'
}

# warn_backlog SYSTEM RATE: a warning in the log when the run in $res
# achieved less than 95% of RATE, the rate offered to SYSTEM.
warn_backlog() {
  if awk -v a="$(field achieved)" -v r="$2" 'BEGIN { exit !(a < 0.95 * r) }'; then
    log "warning: $1 achieved $(field achieved)/s of $2/s offered: its latency figures measure a backlog"
  fi
}

# log_latencies R SYSTEM: the latencies of fixed-rate round R against
# SYSTEM in the log, from the RESULT line in $res.
log_latencies() {
  log "fixed rate round $1 $2: achieved $(field achieved)/s p50 $(field p50_us) us p99 $(field p99_us) us p99.9 $(field p999_us) us (sent late: p50 $(field lag_p50_us) p99 $(field lag_p99_us) us; from the send: p50 $(field svc_p50_us) p99 $(field svc_p99_us) us)"
}

# order R SYSTEM...: the systems in round R's order, reversed every other
# round, so that no system always runs right after the same one.
order() {
  local r=$1; shift
  if [ $((r % 2)) = 1 ]; then echo "$@"; else echo "$@" | tr ' ' '\n' | tac | tr '\n' ' '; fi
}

# median: of the numbers on standard input, separated by spaces or lines.
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# cputicks PID: the process's user + system CPU time so far, in clock ticks.
cputicks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# sum_ticks PID...: the CPU time so far of those processes together, in
# clock ticks.
sum_ticks() { local s=0 p; for p in "$@"; do s=$((s + $(cputicks "$p"))); done; echo "$s"; }

# childticks: the CPU time so far of this shell's waited-for children (the
# load generators among them), in clock ticks.
childticks() { awk '{ print $16 + $17 }' "/proc/$$/stat"; }

# measure SYSTEM REDIS_PIDS CMD...: runs CMD, a load generator aimed at
# SYSTEM (started by start); dies, its output shown, with "CMD against
# SYSTEM failed" if it fails. Leaves its output in out and its RESULT line
# in res, and the CPU time spent meanwhile, in clock ticks, by SYSTEM's
# process in ticks_server, by the redis-servers of REDIS_PIDS (a list
# separated by spaces, maybe empty) in ticks_redis and by this shell's
# children (the generator) in ticks_loadgen.
measure() {
  local s=$1 pid c0 r0 g0 rp; shift
  read -ra rp <<<"$1"; shift
  pid=$(eval echo "\$pid_$s")
  c0=$(cputicks "$pid"); r0=$(sum_ticks "${rp[@]}"); g0=$(childticks)
  out=$("$@" 2>&1) || { echo "$out" >&2; die "${1##*/} against $s failed"; }
  # shellcheck disable=SC2034 # the sourcing script reads them
  ticks_server=$(($(cputicks "$pid") - c0)) ticks_redis=$(($(sum_ticks "${rp[@]}") - r0)) ticks_loadgen=$(($(childticks) - g0))
  res=$(echo "$out" | grep '^RESULT')
}
