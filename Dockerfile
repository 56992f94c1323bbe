# syntax=docker/dockerfile:1
# Static binaries on a distroless base, run as non-root. The default (last) target is
# mdproxy; `--target coresim` builds the Core emulator (deploy/compose.yaml uses both).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags="-s -w -X github.com/mdproxy/mdproxy/metrics.Version=${VERSION}" \
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
