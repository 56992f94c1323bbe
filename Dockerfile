# syntax=docker/dockerfile:1
# Static binaries on a distroless base, run as non-root. The default (last) target is
# mdproxy; `--target coresim` builds the Core emulator (deploy/compose.yaml uses both).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The version and the VCS revision stamped in both binaries (--version, the start-up
# log, mdproxy_build_info): the context has no .git for Go to read the revision from,
# so pass it, e.g. --build-arg REVISION=$(git rev-parse HEAD).
ARG VERSION=dev
ARG REVISION
RUN test -n "${REVISION}" || { echo 'build with --build-arg REVISION=$(git rev-parse HEAD): mdproxy_build_info must name the revision' >&2; exit 1; }
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags="-s -w -X github.com/mdproxy/mdproxy/metrics.Version=${VERSION} -X github.com/mdproxy/mdproxy/metrics.Revision=${REVISION}" \
      -o /out/ ./cmd/mdproxy ./cmd/coresim

FROM gcr.io/distroless/static-debian12:nonroot AS coresim
COPY --from=build /out/coresim /coresim
USER nonroot:nonroot
# 8008: Core's API. 9008: the emulator's /metrics.
EXPOSE 8008 9008
ENTRYPOINT ["/coresim"]

FROM gcr.io/distroless/static-debian12:nonroot AS mdproxy
COPY --from=build /out/mdproxy /mdproxy
USER nonroot:nonroot
# 8009: Core's API, proxied. 9009: /metrics, /healthz, /readyz of the proxy itself.
EXPOSE 8009 9009
ENTRYPOINT ["/mdproxy"]
