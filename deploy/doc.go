// Package deploy holds no code: its tests prove the files of deploy/ (Grafana dashboard
// and provisioning, Prometheus configuration and rules, compose file, Kubernetes
// manifests) against real binaries and a real Prometheus. Run them with deploy/check.sh.
package deploy
