# syntax=docker/dockerfile:1
#
# The delayq relay and CLI as a container image: one static binary on a
# distroless base (no shell, no package manager; CA certificates for TLS URLs),
# run as a non-root user.
#
#   docker build -t delayq .                                   # the relay/CLI image (the last stage)
#   docker build --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) -t delayq .
#   docker build --target payment -t delayq-payment .          # examples/payment, as compose.yaml runs it
#   docker run --rm delayq version
#
# cmd/delayq/release_test.go runs this file's `go build` of ./cmd/delayq outside a
# container and checks that the binary is static; where a container builder
# runs, it builds the image and runs `delayq version` in it.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first: this layer stays cached while only the source changes.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
# Stamped into `delayq version` (the context has no .git, so the build info has
# no commit of its own).
ARG VERSION=
ARG COMMIT=
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION} -X main.buildCommit=${COMMIT}" \
    -o /out/delayq ./cmd/delayq
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w" -o /out/payment ./examples/payment

# examples/payment (enqueue, worker, report): the worker of compose.yaml.
FROM gcr.io/distroless/static-debian12:nonroot AS payment
COPY --from=build /out/payment /payment
USER 65532:65532
ENTRYPOINT ["/payment"]
CMD ["worker"]

# The relay and CLI: the default image.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/delayq /delayq
# distroless's "nonroot" user, by number so that Kubernetes' runAsNonRoot can
# check it.
USER 65532:65532
# /metrics, /healthz and /readyz of the relay started by CMD.
EXPOSE 9090
# No shell in the image: the binary GETs its own /healthz.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/delayq", "healthcheck", "--addr", "127.0.0.1:9090"]
ENTRYPOINT ["/delayq"]
# The relay listens on every interface inside the container (the binary's
# default, 127.0.0.1:9090, would be unreachable from outside it). Any other
# command replaces this: docker run --rm delayq migrate up.
CMD ["relay", "--listen", ":9090"]
