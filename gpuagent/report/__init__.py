"""``gpuagent report``: GPU chargeback from the accounting counters, read back from Prometheus.

The agent counts allocated, busy and idle GPU-seconds, GPU memory byte-seconds and energy per pod (and per
non-Kubernetes workload); Prometheus keeps them. This package asks any server that speaks Prometheus's HTTP
API (Prometheus, Thanos, Mimir) for their ``increase()`` over a time range and prints it per namespace and
pod, as a table, CSV, JSON or a self-contained HTML page. It never imports the agent's sources or consumers:
its only input is the HTTP API.
"""
