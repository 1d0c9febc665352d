#!/usr/bin/env bash
# Redis Cluster beside a single server: BenchmarkRedisClusterCost runs 64
# concurrent callers through a Limiter (5 ms deadline) over 100 000
# subjects on one redis-server and on a Cluster of three primaries, each
# started by the benchmark, and reads Redis's CPU (INFO cpu, summed over
# the primaries), the share of checks the store decided and the breaker's
# openings. It runs CLUSTER_BENCH_ROUNDS times (default 3); each round's
# ratio of the Cluster's Redis CPU per check to the single server's is
# taken within the round, so that a busy neighbour moves both, and the
# median of the rounds is printed, with the lowest share decided by the
# store and the most breaker openings of any round.
# CLUSTER_BENCH_N sets the checks per measurement (default 100000).
set -euo pipefail
cd "$(dirname "$0")/.."
n="${CLUSTER_BENCH_N:-100000}"
rounds="${CLUSTER_BENCH_ROUNDS:-3}"
# One go test per round: with -count, go test runs every round of the
# single server before the first of the Cluster, and a round's two
# figures would come minutes apart.
go test -c -o "${TMPDIR:-/tmp}/cluster-bench.test" ./engine/redisstore/
trap 'rm -f "${TMPDIR:-/tmp}/cluster-bench.test"' EXIT
out=
for _ in $(seq "$rounds"); do
  o=$(cd engine/redisstore && "${TMPDIR:-/tmp}/cluster-bench.test" -test.run '^$' -test.bench '^BenchmarkRedisClusterCost$/^(single|cluster3)$' -test.benchtime "${n}x" -test.timeout 30m 2>&1) || {
    echo "$o" >&2
    exit 1
  }
  out+="$o"$'\n'
done
echo "$out" | grep '^Benchmark' >&2
echo "$out" | awk '
function metric(unit,   i) { for (i = 3; i < NF; i += 2) if ($(i + 1) == unit) return $i; return "" }
/^BenchmarkRedisClusterCost\/single/   { s[++ns] = metric("redis-cpu-ns/check"); sc[ns] = metric("checks/call") }
/^BenchmarkRedisClusterCost\/cluster3-/ {
  c[++nc] = metric("redis-cpu-ns/check"); cc[nc] = metric("checks/call")
  st = metric("%store"); if (store == "" || st + 0 < store + 0) store = st
  bo = metric("breaker-opens"); if (opens == "" || bo + 0 > opens + 0) opens = bo
}
END {
  if (ns == 0 || ns != nc) { print "bench/cluster.sh: missing benchmark output" > "/dev/stderr"; exit 1 }
  for (i = 1; i <= ns; i++) r[i] = c[i] / s[i]
  for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
  m = int((ns + 1) / 2)
  for (i = 1; i <= ns; i++) printf "BENCH cluster3_round%d_redis_cpu_ns_per_check %.0f ns (single %.0f; %.1f and %.1f checks/call)\n", i, c[i], s[i], cc[i], sc[i]
  printf "BENCH cluster3_redis_cpu_over_single %.2f ratio\n", r[m]
  printf "BENCH cluster3_store_decided_min %s %%\n", store
  printf "BENCH cluster3_breaker_opens_max %s opens\n", opens
}'
