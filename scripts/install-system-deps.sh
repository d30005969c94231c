#!/usr/bin/env bash
# System packages the tests use: Prometheus and promtool (Debian's prometheus package: lints the exposition,
# tests the alert rules, and a real Prometheus evaluates every dashboard and alert query), systemd-analyze
# (verifies systemd/gpuagent.service), kubectl (Debian's kubernetes-client: `kubectl kustomize deploy/`
# renders what `kubectl apply -k` would apply, and gpuagent recommend's patches are applied with
# kubectl patch --local) and tmux (gpuagent top runs in a real terminal). Idempotent; needs root (or sudo)
# only when something is missing.
set -euo pipefail
missing=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# One transaction for all that is missing (each apt-get run pays dpkg's start-up and the lists' reading)
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The package starts a Prometheus service where an init system runs; the tests start their own.
if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
