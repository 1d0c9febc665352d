# The README's test command is `make test`; .ci/run calls it too.
GO      ?= go
PKGS    := ./...
BIN     := bin/sluice
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: all build test test-deps test-short property race bench bench-peers bench-scale lint fuzz sim-report sim-live gossip-traffic soak soak-inject clean static image helm ops-test demo demo-test

all: build

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/sluice

# All tests, with real redis-server, Redis Cluster and nginx processes that
# the tests start themselves on loopback ports. The live simulator's
# comparisons with the virtual run are measurements, not tests: make
# sim-live runs them; make test keeps a short live smoke test. Under CI=true
# a test the machine was too slow for fails instead of skipping.
test: test-deps lint
	$(GO) test -count=1 -timeout 45m $(PKGS)
	$(GO) test -count=1 -race -timeout 45m $(PKGS)

# The Debian packages the tests start (installed as root, else the command
# to run is printed and make stops).
test-deps:
	@bash .ci/test-deps

# The simulator's share property over 1000 seeds of every built-in scenario
# (make test runs 250 in its first pass, 50 under the race detector).
property:
	$(GO) test -count=1 -timeout 45m -run '^TestPropertySharesValid$$' ./simulator/ -args -property-seeds 1000

# Unit tests only: everything that needs a real server skips.
test-short:
	$(GO) test -short -count=1 $(PKGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags simlive ./simulator/live/

# Benchmarks end with one `BENCH <name> <value> <unit>` line per figure.
# BenchmarkHotKeyIsolation runs apart, 10 000 checks: 500 in each of its
# 20 phases, so that each phase's p99 is of enough checks.
bench:
	@mkdir -p out
	$(GO) test -run '^$$' -bench . -skip '^(BenchmarkRedis|BenchmarkHotKeyIsolation)' -benchmem -count 1 -timeout 30m ./engine/... ./simulator/... 2>&1 | tee out/bench.txt
	$(GO) test -run '^$$' -bench '^BenchmarkHotKeyIsolation$$' -benchtime 10000x -count 1 -timeout 10m ./engine/redisstore/ 2>&1 | tee -a out/bench.txt
	$(GO) test -run '^$$' -bench 'JSON' -benchmem -count 1 -timeout 10m ./region/ 2>&1 | tee -a out/bench.txt
	@bash bench/extra.sh 2>&1 | tee -a out/bench.txt
	@echo "---- summary ----"
	@awk -f bench/summary.awk out/bench.txt

# Sluice beside Gubernator, envoyproxy/ratelimit and a trivial handler on
# loopback, the same load for each (bench/README.md). The peers are built
# once with go install into SLUICE_TOOLS (default ~/.cache/sluice-tools).
bench-peers:
	@mkdir -p out
	@bash -o pipefail -c '{ bash bench/peers.sh && bash bench/peers_tls.sh; } 2>&1 | tee out/bench-peers.txt'

# K daemons x a Redis Cluster of M primaries on this machine at saturation:
# decisions per CPU-second of the daemons and of Redis for each M x K, the
# single server beside them, and a slot migration under load
# (bench/scale.sh; MS, KS, SECS to change the grid).
bench-scale:
	@mkdir -p out
	@bash -o pipefail -c 'bash bench/scale.sh 2>&1 | tee out/bench-scale.txt'

# Each fuzz target for a short while; FUZZTIME=10m for a longer hunt.
FUZZTIME ?= 15s
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s $$pkg || exit 1; \
	  done; \
	done

# docs/simulation-results.md from every built-in scenario, seeds 1, 2 and 3
# (the notes written by hand at its end are kept).
sim-report:
	$(GO) run ./simulator/cmd/simreport -seeds 1,2,3

# The live-against-virtual comparisons of simulator/live (real daemons on
# loopback beside the virtual-time run, about 15 min, test-deps' redis
# needed): each run's figures go into docs/simulation-results.md's "Live
# against virtual" section, the log into out/sim-live.txt; a comparison
# out of its bound still has its row written, and fails the target.
sim-live:
	@mkdir -p out
	@rm -f out/sim-live-rows.md
	@st=0; SIM_LIVE_OUT=$(CURDIR)/out/sim-live-rows.md bash -o pipefail -c \
	  '$(GO) test -tags simlive -count=1 -timeout 60m -v ./simulator/live/ 2>&1 | tee out/sim-live.txt' || st=$$?; \
	  bash simulator/live/sim-live-doc.sh out/sim-live-rows.md docs/simulation-results.md; exit $$st

# Gossip traffic per node, measured: 3 regions × 2 and × 4 real memberlist
# nodes on loopback (TestGossipTrafficLive), and the same on virtual time
# with 3 × 2 and 3 × 8 coordinator cores (TestRelayTrafficPerNode, which
# asserts the 1.2× bound). docs/architecture.md's gossip section records
# the figures.
gossip-traffic:
	$(GO) test -count=1 -run 'TestGossipTrafficLive' -v ./gossip/
	$(GO) test -count=1 -run 'TestRelayTrafficPerNode' -v ./coordinator/

# The soak (soak/cmd/soak): three regions of two daemons each (single
# Redis behind nginx, Sentinel with RLS clients, a 3-primary Cluster), a
# seeded traffic and nemesis for SOAK (60m; SOAK=5m for a quick one), an
# independent checker of what the clients saw, leak figures; the report in
# out/soak/report.{json,html}. Exits non-zero on any violation. Not part
# of make test; needs test-deps' redis-server and nginx. SOAK_FAULTS
# names the nemesis's faults (all, or a comma-separated list).
SOAK        ?= 60m
SOAK_SEED   ?= 1
SOAK_FAULTS ?= all
soak:
	@mkdir -p out/soak
	$(GO) build -o bin/soak ./soak/cmd/soak
	bin/soak -duration $(SOAK) -seed $(SOAK_SEED) -faults $(SOAK_FAULTS) -out out/soak

# The checker shown able to fail: a 2-minute soak without faults in which
# the api policy is raised through one daemon half-way, hidden from the
# checker; passes only if the soak fails with that over-admission reported.
soak-inject:
	@mkdir -p out/soak-inject
	$(GO) build -o bin/soak ./soak/cmd/soak
	@# The soak's own status decides, not a pipe's last command's.
	@if bin/soak -duration 2m -seed $(SOAK_SEED) -faults none -inject over-admission -out out/soak-inject > out/soak-inject/summary.txt; then \
	  cat out/soak-inject/summary.txt; echo "soak-inject: the soak passed with a hidden over-admission"; exit 1; fi; \
	cat out/soak-inject/summary.txt
	@grep -Eq 'injected_seen=[1-9]' out/soak-inject/summary.txt || { echo "soak-inject: the injected over-admission was not reported"; exit 1; }
	@echo "soak-inject: the checker reported the hidden over-admission"

# The static linux binary the image holds (no cgo, no libc).
GOARCH_IMAGE ?= amd64
static:
	CGO_ENABLED=0 GOOS=linux GOARCH=$(GOARCH_IMAGE) $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o bin/linux-$(GOARCH_IMAGE)/sluice ./cmd/sluice

# The container image (Dockerfile): FROM scratch, the static binary, UID 65532.
IMAGE ?= sluice:$(VERSION)
image: static
	docker build --build-arg TARGETARCH=$(GOARCH_IMAGE) -t $(IMAGE) .

# helm lint and helm template on deploy/helm/sluice, and the checks of the
# rendered objects; helm is built with go install into SLUICE_TOOLS.
helm:
	$(GO) test -count=1 -run 'Helm' ./deploy/

# The deployment checks: helm, promtool check/test rules, the dashboard
# and alert rules against a running daemon's /metrics, the static binary.
ops-test:
	$(GO) test -count=1 ./deploy/
	$(GO) test -count=1 -run 'TestOpsMetricsExported' ./cmd/sluice/

# Three regions on this machine: redis-server, two daemons and nginx per
# region, and Prometheus (deploy/demo/README.md). Ctrl-C stops it all.
demo: build
	bash deploy/demo/demo.sh

# The demo started, driven through one region's nginx, seen in Prometheus,
# and stopped, in about ten seconds (go test ./deploy runs the same, so make
# test does too).
demo-test: build
	DEMO_SMOKE=1 bash deploy/demo/demo.sh

clean:
	rm -rf bin out
