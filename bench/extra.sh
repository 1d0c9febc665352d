#!/usr/bin/env bash
# Benchmarks that need more than `go test -bench`: each script below prints
# its own BENCH lines. Missing scripts are skipped.
set -uo pipefail
cd "$(dirname "$0")"
for s in redis.sh cluster.sh; do
  [ -f "$s" ] && bash "$s"
done
exit 0
