#!/usr/bin/env bash
# System packages the tests use: promtool (Debian's prometheus package) to lint the exposition.
# Idempotent; needs root (or sudo) only when something is missing.
set -euo pipefail
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The package starts a Prometheus service where an init system runs; the tests start their own.
if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
