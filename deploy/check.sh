#!/usr/bin/env bash
# Checks everything in deploy/: Prometheus configuration and rules (promtool), the
# alert unit tests, the YAML and JSON files, and the integration test that runs a real
# Prometheus against mdproxy and the Core emulator under mdbench --quick.
# Needs Debian's prometheus package (promtool, prometheus) and Go.
set -euo pipefail
cd "$(dirname "$0")"
promtool check config prometheus/prometheus.yml
promtool check rules prometheus/rules/*.yml
promtool test rules prometheus/tests/alerts_test.yml
go test -count=1 -v .
