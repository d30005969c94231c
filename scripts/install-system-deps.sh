#!/usr/bin/env bash
# System packages the tests use: promtool, from Debian's prometheus package (lints the exposition; later
# issues also run a real Prometheus). Idempotent; needs root (or sudo) only when something is missing.
set -euo pipefail
command -v promtool >/dev/null 2>&1 && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package starts a Prometheus service where an init system runs; the tests start their own.
if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
