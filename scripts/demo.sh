#!/usr/bin/env bash
# `make demo`: the demo node (gpuagent demo) scraped by a Prometheus of its own that already holds a week of
# the node's past, so `gpuagent report` and `gpuagent recommend` have something to say at once.
#   1. python -m gpuagent.demo.history writes the week (the agent itself on the demo node, polled every 5
#      minutes of simulated time) as OpenMetrics, with the instance and job labels the live scrape adds;
#   2. promtool tsdb create-blocks-from openmetrics turns it into TSDB blocks;
#   3. Debian's prometheus serves them and scrapes the live demo every 15 s (honor_labels, as deploy/ does);
#   4. gpuagent demo runs until Ctrl-C (or SIGTERM, or SIGHUP: the terminal closed), which stops it (with a
#      SIGTERM, so that it removes its own temporary directory) and Prometheus, and removes $WORK.
# Everything lives under $WORK (default .demo/, removed first and at the end). Nothing here is a real GPU.
set -euo pipefail
BIN=${BIN:-.venv/bin}
LISTEN=${LISTEN:-127.0.0.1:9402}
PROMETHEUS_LISTEN=${PROMETHEUS_LISTEN:-127.0.0.1:9090}
DAYS=${DAYS:-7}
WORK=${WORK:-.demo}
for tool in prometheus promtool; do
  command -v "$tool" >/dev/null || { echo "demo: $tool is missing: run scripts/install-system-deps.sh" >&2; exit 2; }
done
rm -rf "$WORK"
mkdir -p "$WORK/data"
echo "demo: writing $DAYS days of the demo node's history (a minute or two) ..." >&2
"$BIN/python" -m gpuagent.demo.history --days "$DAYS" --instance "$LISTEN" --job gpuagent --out "$WORK/history.om"
promtool tsdb create-blocks-from openmetrics --quiet "$WORK/history.om" "$WORK/data" >/dev/null
rm -f "$WORK/history.om"
cat > "$WORK/prometheus.yml" <<YAML
global: {scrape_interval: 15s, evaluation_interval: 15s}
scrape_configs:
  - job_name: gpuagent
    honor_labels: true
    static_configs: [{targets: ["$LISTEN"]}]
YAML
prometheus --config.file "$WORK/prometheus.yml" --storage.tsdb.path "$WORK/data" \
  --storage.tsdb.retention.time 30d --web.listen-address "$PROMETHEUS_LISTEN" >"$WORK/prometheus.log" 2>&1 &
prometheus_pid=$!
demo_pid=
# On any way out: the demo first (SIGTERM: it thaws, stops and removes its temporary directory), then
# Prometheus, then $WORK. A signal's exit status is 128 + its number, as the shell's own would be.
stop() {
  trap - EXIT HUP INT TERM
  if [ -n "$demo_pid" ]; then kill -TERM "$demo_pid" 2>/dev/null; wait "$demo_pid" 2>/dev/null || true; fi
  kill "$prometheus_pid" 2>/dev/null; wait "$prometheus_pid" 2>/dev/null || true
  rm -rf "$WORK"
}
trap stop EXIT
trap 'stop; exit 129' HUP
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
cat >&2 <<TEXT
demo: Prometheus on http://$PROMETHEUS_LISTEN (log: $WORK/prometheus.log), the agent on http://$LISTEN; try:
  $BIN/gpuagent top --agent http://$LISTEN
  $BIN/gpuagent report --prometheus http://$PROMETHEUS_LISTEN --since 7d
  $BIN/gpuagent recommend --prometheus http://$PROMETHEUS_LISTEN --since 7d
TEXT
# In the background, SIGHUP ignored, so that the traps above stop it: a hangup would otherwise kill it before
# it can clean up, and the shell runs a trap only once its foreground command has ended.
( trap '' HUP; exec "$BIN/gpuagent" demo --listen "$LISTEN" ) &
demo_pid=$!
status=0
wait "$demo_pid" || status=$?
demo_pid=
exit "$status"
