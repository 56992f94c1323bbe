# syntax=docker/dockerfile:1
# Build a static mdproxy binary, then ship it alone on a distroless base as non-root.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags="-s -w -X github.com/mdproxy/mdproxy/metrics.Version=${VERSION}" \
      -o /out/mdproxy ./cmd/mdproxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/mdproxy /mdproxy
USER nonroot:nonroot
# 8009: Core's API, proxied. 9009: /metrics, /healthz, /readyz of the proxy itself.
EXPOSE 8009 9009
ENTRYPOINT ["/mdproxy"]
