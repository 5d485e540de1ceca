# delayq — `make help` lists the targets.
GO ?= go

# The development build of cmd/delayq: bench, and throwaway servers for demo and
# bench. The binary built without it (go build ./cmd/delayq, the Dockerfile) links
# no test servers and no Docker client.
DEVTAGS := -tags delayqdev

# Three modules, one workspace (go.work): the root (the library users import, and
# the CLI), delayqotel (the OpenTelemetry adapter, a module of its own) and
# internal/dev (the tests' Docker fallback and the dashboard's browser tests:
# dockertest and chromedp, kept out of users' go.sum). `./...` does not enter a
# nested module, so the targets name every module's packages.
NESTED  := delayqotel internal/dev
MODULES := . $(NESTED)
PKGS    := ./... $(addprefix ./,$(addsuffix /...,$(NESTED)))

# Issue 30's comparison service written against River: a module of its own,
# outside the workspace. make lint builds and vets it (tests included) and
# compares its length with docs/comparison/delayq's; its tests need a database
# migrated by River and are run by hand (docs/comparison.md).
RIVER_CMP := docs/comparison/river

# Runs a command with servers: local binaries (started by the tests and the
# demo themselves), else Docker containers whose URLs it passes on.
WITHSERVERS := GO=$(GO) bash .ci/withservers

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: servers
servers: ## Make sure PostgreSQL and Redis can be started (installs them on Debian/Ubuntu).
	@bash .ci/servers

.PHONY: demo
demo: servers ## Run the end-to-end demo on throwaway servers (or DATABASE_URL/REDIS_URL).
	$(WITHSERVERS) app -- $(GO) run $(DEVTAGS) ./cmd/delayq demo

.PHONY: demo-ui
demo-ui: servers ## Watch a live demo workload in the dashboard: http://127.0.0.1:8080 (Ctrl-C stops it).
	$(WITHSERVERS) app -- $(GO) run $(DEVTAGS) ./cmd/delayq demo --ui

.PHONY: build
build: ## Build bin/delayq: the static relay/CLI binary, as the Dockerfile builds it.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o bin/delayq ./cmd/delayq

.PHONY: browser
browser: ## Make sure a headless Chromium is there for the dashboard's browser tests (installs it on Debian/Ubuntu).
	@bash .ci/browser

.PHONY: examples-deps
examples-deps: ## Make sure the Python and Node examples run: python3-psycopg, nodejs, npm (Debian/Ubuntu), npm ci in examples/node.
	@bash .ci/examples

# The slow suites run after the others, at go test's own parallelism: several
# fault scenarios at once exhaust their server's connections, and the rate-limit
# scenario needs a machine faster than its limit.
.PHONY: test
test: servers browser examples-deps ## Run every test of every module against real servers, with the race detector.
	$(WITHSERVERS) test -- $(GO) test $(TESTFLAGS) -timeout 20m -bench . -benchtime 1x $$($(GO) list $(PKGS) | grep -vE '$(SLOW_PKGS)')
	$(WITHSERVERS) test -- $(GO) test -race -count=1 -timeout 20m -bench . -benchtime 1x $$($(GO) list $(PKGS) | grep -E '$(SLOW_PKGS)')

# The quick loop leaves out the suites that take minutes whatever -short says:
# faults (processes killed, servers restarted), clustertest (Redis Clusters),
# securitytest (TLS servers, the built binary), bench (the workloads),
# tempserver and dev/dockerserver (start and kill servers) and dev/uibrowser (a
# headless Chromium per test, which make browser installs for make test). The
# others skip their big cases under -short (testing.Short).
SLOW_PKGS := /internal/(faults|clustertest|securitytest|bench|tempserver|dev/dockerserver|dev/uibrowser)$$

# Most of a test's time is waiting (on a lease, a relay round, a server), not
# CPU: -parallel 8 lets a package's t.Parallel tests wait together (the default
# is GOMAXPROCS, 2 here) and -p 4 runs four test binaries at once. The race
# detector's 1 s sleep at each binary's exit (GORACE atexit_sleep_ms), for
# reports from goroutines still running, is left out of the quick loop: testenv.Main
# fails a package whose goroutines outlive its tests, and `make test` keeps it.
TESTFLAGS := -race -count=1 -p 4 -parallel 8

.PHONY: test-short
test-short: servers ## The quick loop (75–80 s on a 2-core machine, build cache warm: CONTRIBUTING): -short -race, without the fault, cluster, security, bench and browser suites.
	GORACE="atexit_sleep_ms=0 $${GORACE:-}" $(WITHSERVERS) test -- $(GO) test -short $(TESTFLAGS) -timeout 5m $$($(GO) list $(PKGS) | grep -vE '$(SLOW_PKGS)')

.PHONY: bench
bench: servers ## Run the benchmark workloads (delayq bench) and the micro benchmarks.
	$(GO) test -run '^$$' -bench . -benchmem ./internal/dispatch ./outbox ./internal/validate
	$(WITHSERVERS) app --durable -- $(GO) run $(DEVTAGS) ./cmd/delayq bench

# Analyzers run with `go run module@version`: pinned, nothing installed.
# staticcheck 2026.2.2 (v0.8.2) supports go.mod's Go 1.26; nilness (x/tools)
# reports nil dereferences and impossible nil comparisons that vet does not.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
NILNESS     := golang.org/x/tools/go/analysis/passes/nilness/cmd/nilness@v0.51.0

.PHONY: lint
lint: ## gofmt, go vet, staticcheck, nilness (every module; both builds of cmd/delayq), go mod tidy -diff, the consumer's go.sum, the River comparison's build and line counts.
	@test -z "$$(gofmt -l .)" || (echo "gofmt -l:" && gofmt -l . && exit 1)
	$(GO) vet $(PKGS)
	$(GO) vet $(DEVTAGS) ./cmd/delayq
	$(GO) run $(STATICCHECK) $(PKGS)
	$(GO) run $(STATICCHECK) $(DEVTAGS) ./cmd/delayq
	$(GO) run $(NILNESS) $(PKGS)
	$(GO) run $(NILNESS) $(DEVTAGS) ./cmd/delayq
	@for m in $(MODULES); do echo "go mod tidy -diff ($$m)"; (cd $$m && GOWORK=off $(GO) mod tidy -diff) || exit 1; done
	@bash scripts/consumer-gosum.sh
	cd $(RIVER_CMP) && GOWORK=off $(GO) mod tidy -diff && GOWORK=off $(GO) vet ./...
	@bash scripts/comparison-lines.sh

.PHONY: comparison-lines
comparison-lines: ## Count the lines of the comparison service's two versions (docs/comparison/): delayq's must be 25 % shorter than River's.
	@bash scripts/comparison-lines.sh

.PHONY: consumer-gosum
consumer-gosum: ## A throwaway module that imports the library: its go.sum line count, no test tools in it, and examples/payment tested in it with no set-up.
	@bash scripts/consumer-gosum.sh
