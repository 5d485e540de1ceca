# delayq — `make help` lists the targets.
GO ?= go

# The development build of cmd/delayq: bench, and throwaway servers for demo and
# bench. The binary built without it (go build ./cmd/delayq, the Dockerfile) links
# no test servers and no Docker client.
DEVTAGS := -tags delayqdev

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: servers
servers: ## Make sure PostgreSQL and Redis can be started (installs them on Debian/Ubuntu).
	@bash .ci/servers

.PHONY: demo
demo: servers ## Run the end-to-end demo on throwaway servers (or DATABASE_URL/REDIS_URL).
	$(GO) run $(DEVTAGS) ./cmd/delayq demo

.PHONY: test
test: servers ## Run every test against real servers, with the race detector.
	$(GO) test -race -count=1 -timeout 20m -bench . -benchtime 1x ./...

.PHONY: bench
bench: servers ## Run the benchmark workloads (delayq bench) and the micro benchmarks.
	$(GO) test -run '^$$' -bench . -benchmem ./delayq ./outbox ./internal/validate
	$(GO) run $(DEVTAGS) ./cmd/delayq bench

.PHONY: lint
lint: ## gofmt and go vet.
	@test -z "$$(gofmt -l .)" || (gofmt -l . && exit 1)
	$(GO) vet ./...
