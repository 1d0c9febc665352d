// Package deploy holds no code: its tests check the deployment files
// beside it (the Helm chart, the Prometheus rules, the Grafana dashboard,
// the Dockerfile's static binary) with the real tools, helm and promtool.
package deploy
