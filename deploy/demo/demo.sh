#!/usr/bin/env bash
# Three Sluice regions on one machine, from Debian packages only:
#
#   per region (eu, us, ap): its own redis-server, two `sluice serve`
#   daemons on it, and an nginx gateway running the shipped
#   deploy/nginx/sluice.conf (placeholders replaced) in front of a small
#   API; one Prometheus scraping all six daemons with the alert rules of
#   deploy/prometheus/alerts.yml.
#
# Usage: make demo            (builds bin/sluice, runs this; Ctrl-C stops all)
#        make demo-test       (DEMO_SMOKE=1: start, drive traffic through eu's
#                              nginx, see it in Prometheus, stop)
#        bash deploy/demo/demo.sh render-compose DIR
#                             (the compose setup's nginx configurations)
#
# Needs: redis-server, nginx, prometheus (apt-get install redis-server nginx
# prometheus), curl. Settings: SLUICE_BIN (default bin/sluice), DEMO_PORT
# (first of the ports used, default 18000), DEMO_DIR (working directory,
# default a new one under /tmp).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
regions=(eu us ap)

# render_nginx REGION LISTEN BACKEND DAEMON... : the shipped nginx
# configuration with its placeholders replaced, on standard output.
render_nginx() {
  local region=$1 listen=$2 backend=$3; shift 3
  local servers="" d p
  for d in "$@"; do servers+="server $d; "; done
  local conf
  conf=$(<"$root/deploy/nginx/sluice.conf")
  for p in "server 127.0.0.1:8080;" "listen 80;" "http://backend"; do
    [[ $conf == *"$p"* ]] || { echo "deploy/nginx/sluice.conf lacks the placeholder '$p'" >&2; return 1; }
  done
  conf=${conf//"server 127.0.0.1:8080;"/"$servers"}
  conf=${conf//"listen 80;"/"listen $listen;"}
  conf=${conf//"http://backend"/"$backend"}
  printf '# Region %s: deploy/nginx/sluice.conf, placeholders replaced by deploy/demo/demo.sh.\n%s\n' "$region" "$conf"
}

if [[ ${1:-} == render-compose ]]; then
  out=${2:?usage: demo.sh render-compose DIR}
  mkdir -p "$out"
  for r in "${regions[@]}"; do
    render_nginx "$r" 80 "http://api-$r:8000" "sluice-$r-1:8080" "sluice-$r-2:8080" >"$out/nginx-$r.conf"
  done
  exit 0
fi

need() { command -v "$1" >/dev/null 2>&1 || [[ -x /usr/sbin/$1 ]] || { echo "demo: $1 is missing: apt-get install -y $2" >&2; exit 1; }; }
need redis-server redis-server
need nginx nginx
need prometheus prometheus
need curl curl
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
bin=${SLUICE_BIN:-$root/bin/sluice}
[[ -x $bin ]] || { echo "demo: $bin is missing: run make build (or make demo)" >&2; exit 1; }

base=${DEMO_PORT:-18000}
work=${DEMO_DIR:-$(mktemp -d /tmp/sluice-demo.XXXXXX)}
mkdir -p "$work"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_http URL WHAT: until URL answers 2xx, at most 30 s.
wait_http() {
  local i
  for i in $(seq 1 150); do
    curl -fsS -o /dev/null -m 1 "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "demo: $2 did not come up ($1); logs in $work" >&2
  exit 1
}

head -c 32 /dev/urandom | base64 >"$work/gossip.key"
head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$work/admin.token"
cp "$here/policies.json" "$work/policies.json"

# Ports, per region i: redis base+10i, daemons +1 +2, gossip +5 +6, nginx
# +8, the API behind it +9; Prometheus base+100.
seed=""
targets=""
for i in "${!regions[@]}"; do
  r=${regions[$i]}
  p=$((base + 10 * i))
  mkdir -p "$work/$r"
  redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$work/$r" \
    --logfile "$work/$r/redis.log" &
  pids+=($!)
  for _ in $(seq 1 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
  daemons=()
  for n in 1 2; do
    gp=$((p + 4 + n))
    args=(serve --listen "127.0.0.1:$((p + n))" --store "redis://127.0.0.1:$p" --policies "$work/policies.json"
      --admin-token-file "$work/admin.token" --data-dir "$work/$r/n$n" --trusted-proxies 127.0.0.1/32
      --region "$r" --node "$r-$n" --gossip-listen "127.0.0.1:$gp" --gossip-key-file "$work/gossip.key"
      --gossip-preset local --decision-log "$work/$r/events-$n.jsonl" --decision-log-allow-rate 0.01)
    [[ -n $seed ]] && args+=(--join "$seed")
    "$bin" "${args[@]}" 2>"$work/$r/sluice-$n.log" &
    pids+=($!)
    wait_http "http://127.0.0.1:$((p + n))/healthz" "sluice $r-$n"
    [[ -n $seed ]] || seed="127.0.0.1:$gp"
    daemons+=("127.0.0.1:$((p + n))")
    targets+="      - targets: ['127.0.0.1:$((p + n))']
        labels: {sluice_region: $r}
"
  done
  # nginx: the shipped configuration, and the API it protects.
  mkdir -p "$work/$r/nginx/tmp" "$work/$r/nginx/logs"
  render_nginx "$r" "127.0.0.1:$((p + 8))" "http://127.0.0.1:$((p + 9))" "${daemons[@]}" >"$work/$r/nginx/sluice.conf"
  user=""; [[ $(id -u) -eq 0 ]] && user="user root;"
  cat >"$work/$r/nginx/nginx.conf" <<EOF
$user
worker_processes 1;
pid $work/$r/nginx/nginx.pid;
error_log $work/$r/nginx/logs/error.log warn;
events { worker_connections 512; }
http {
  access_log off;
  client_body_temp_path $work/$r/nginx/tmp/body;
  proxy_temp_path $work/$r/nginx/tmp/proxy;
  fastcgi_temp_path $work/$r/nginx/tmp/fastcgi;
  uwsgi_temp_path $work/$r/nginx/tmp/uwsgi;
  scgi_temp_path $work/$r/nginx/tmp/scgi;
  include $work/$r/nginx/sluice.conf;
  server {
    listen 127.0.0.1:$((p + 9));
    location / { default_type application/json; return 200 '{"api":"demo","region":"$r"}\n'; }
  }
}
EOF
  "$nginx_bin" -c "$work/$r/nginx/nginx.conf" -p "$work/$r/nginx" -g 'daemon off;' &
  pids+=($!)
  wait_http "http://127.0.0.1:$((p + 9))/" "the $r API"
done

prom=$((base + 100))
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 2s
  evaluation_interval: 2s
rule_files:
  - $root/deploy/prometheus/alerts.yml
scrape_configs:
  - job_name: sluice
    static_configs:
$targets
EOF
prometheus --config.file "$work/prometheus.yml" --storage.tsdb.path "$work/prometheus" \
  --web.listen-address "127.0.0.1:$prom" >"$work/prometheus.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$prom/-/ready" "Prometheus"

# The three regions find each other over gossip.
for _ in $(seq 1 150); do
  n=$(curl -fsS -H "Authorization: Bearer $(<"$work/admin.token")" "http://127.0.0.1:$((base + 1))/v1/regions" |
    grep -o '"region":"[a-z]*"' | sort -u | wc -l) || n=0
  [[ $n -ge 3 ]] && break
  sleep 0.2
done

cat <<EOF

Sluice demo: three regions on this machine (working directory $work).

  region  gateway (nginx)           daemons                                 redis
$(for i in "${!regions[@]}"; do p=$((base + 10 * i)); printf '  %-6s  http://127.0.0.1:%-10s  http://127.0.0.1:%s  http://127.0.0.1:%s   127.0.0.1:%s\n' "${regions[$i]}" "$((p + 8))/" "$((p + 1))" "$((p + 2))" "$p"; done)

  Prometheus    http://127.0.0.1:$prom/graph   (targets: /targets, alerts: /alerts)
  Admin token   $work/admin.token
  Events        $work/<region>/events-<n>.jsonl (sampled decisions, subjects hashed)

Try:
  for i in \$(seq 60); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:$((base + 8))/v1/orders; done; echo
  curl -s -H "Authorization: Bearer \$(cat $work/admin.token)" http://127.0.0.1:$((base + 1))/v1/decisions/top | jq .
  curl -s -H "Authorization: Bearer \$(cat $work/admin.token)" http://127.0.0.1:$((base + 1))/v1/regions | jq .
  Prometheus: sum by (sluice_region, decision) (rate(sluice_checks_total[1m]))
  Grafana: import deploy/grafana/sluice.json with this Prometheus as its data source.

EOF

if [[ ${DEMO_SMOKE:-} != 1 ]]; then
  echo "Ctrl-C stops everything."
  wait
  exit 0
fi

# Smoke test: traffic through eu's nginx, seen in Prometheus.
gw="http://127.0.0.1:$((base + 8))/v1/orders"
ok=0 limited=0
# One curl for all 80 requests, on one kept-alive connection: a curl per
# request can take longer than the per-ip bucket's 200 ms refill on a busy
# machine, and then nothing is ever rejected.
codes=$(for _ in $(seq 1 80); do printf 'url = "%s"\noutput = "/dev/null"\n' "$gw"; done |
  curl -s -w '%{http_code}\n' -K -)
for code in $codes; do
  case $code in
    200) ok=$((ok + 1)) ;;
    429) limited=$((limited + 1)) ;;
    *) echo "demo smoke: unexpected status $code from $gw" >&2; exit 1 ;;
  esac
done
echo "demo smoke: through eu's nginx: $ok allowed, $limited rejected"
[[ $ok -gt 0 && $limited -gt 0 ]] || { echo "demo smoke: want both admissions and rejections" >&2; exit 1; }
query() { curl -fsS "http://127.0.0.1:$prom/api/v1/query" --data-urlencode "query=$1" | grep -o '"value":\[[^]]*\]' | grep -o '"[0-9.e+-]*"\]$' | tr -d '"]'; }
seen=""
for _ in $(seq 1 100); do
  up=$(query 'sum(up{job="sluice"})' || true)
  rej=$(query 'sum(sluice_checks_total{sluice_region="eu",decision="rejected"})' || true)
  if [[ ${up:-0} == 6 && -n ${rej:-} ]] && awk -v r="$rej" -v l="$limited" 'BEGIN { exit !(r >= l) }'; then
    seen=1
    break
  fi
  sleep 0.3
done
[[ -n $seen ]] || { echo "demo smoke: Prometheus has up=${up:-none}, eu rejections=${rej:-none}; want 6 targets up and at least $limited rejections" >&2; exit 1; }
echo "demo smoke: Prometheus scrapes 6 daemons and counts $rej rejections in eu"
echo "DEMO OK"
