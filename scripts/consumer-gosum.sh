#!/usr/bin/env bash
# Builds a throwaway consumer module in a temporary directory that imports the
# library's packages from this checkout (a replace directive), runs go mod tidy
# and reports its go.sum: the line count and any test tool that leaked into it
# (dockertest, the Docker client, chromedp, the OpenTelemetry SDK). Exits 1 when
# one did. DELAYQ_CONSUMER_OTEL=1 also imports delayqotel (its own module), which
# may bring the OpenTelemetry API but not the SDK. Then it runs
# examples/payment's tests in that module with no server variables set.
#
#   scripts/consumer-gosum.sh          # or: make consumer-gosum
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
export GOWORK=off GOFLAGS=-mod=mod

go mod init example.com/consumer >/dev/null 2>&1
pkgs=(outbox delayq relay schedule dashboard delayqtype migrations delayqtest workflow)
go mod edit -require=github.com/delayq/delayq@v0.0.0-00010101000000-000000000000 \
  -replace=github.com/delayq/delayq="$root"
if [[ -n "${DELAYQ_CONSUMER_OTEL:-}" ]]; then
  pkgs+=(delayqotel)
  go mod edit -require=github.com/delayq/delayq/delayqotel@v0.0.0-00010101000000-000000000000 \
    -replace=github.com/delayq/delayq/delayqotel="$root/delayqotel"
fi
{
  echo "package main"
  echo
  echo "import ("
  for p in "${pkgs[@]}"; do echo "	_ \"github.com/delayq/delayq/$p\""; done
  echo ")"
  echo
  echo "func main() {}"
} >main.go
# tidy's progress lines (finding module for package ...) only on a failure.
go mod tidy 2>tidy.log || { cat tidy.log >&2; exit 1; }
go build ./...

lines=$(wc -l <go.sum)
echo "consumer go.sum: $lines lines ($(cut -d' ' -f1 go.sum | sort -u | wc -l) modules), importing: ${pkgs[*]}"
forbidden='^(github\.com/ory/dockertest|github\.com/docker/|github\.com/moby/|github\.com/containerd/|github\.com/opencontainers/|github\.com/chromedp/|go\.opentelemetry\.io/otel/sdk)'
if [[ -n "${DELAYQ_CONSUMER_VERBOSE:-}" ]]; then cut -d" " -f1 go.sum | sort -u; fi
if bad=$(cut -d' ' -f1 go.sum | sort -u | grep -E "$forbidden"); then
  echo "consumer go.sum holds test tools:" >&2
  echo "$bad" | sed 's/^/  /' >&2
  exit 1
fi

# The same module runs examples/payment's tests as a user's own service would:
# copied in, with no server variables set, so delayqtest starts its servers
# itself (local binaries, else Docker). Issue 31's "go test in a fresh user
# module needs no set-up".
mkdir payment
cp "$root"/examples/payment/*.go payment/
go mod tidy 2>tidy.log || { cat tidy.log >&2; exit 1; }
env -u DELAYQ_TEST_POSTGRES_URL -u DELAYQ_TEST_REDIS_URL -u DATABASE_URL -u REDIS_URL \
  go test -count=1 ./payment/ || { echo "examples/payment's tests fail in a module of their own" >&2; exit 1; }
