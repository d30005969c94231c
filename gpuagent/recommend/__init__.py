"""``gpuagent recommend``: what each GPU workload should ask for, from its history in Prometheus.

The agents count every pod's (and non-Kubernetes workload's) GPU time, SM use, memory, idle time,
throttling and memory-limit stops; Prometheus keeps them. This package reads them back over a range (7
days by default), groups pods into workloads by their owner (``gpuagent_pod_info``), and recommends per
workload: keep, release, a time-slicing share, a MIG profile, MPS, or more; with the GPU-hours and cost
that frees, the node pool's packing, and patches that apply it. Like ``gpuagent report`` (with which it
shares the client, ranges, prices and output pieces: ``gpuagent.prom``, ``gpuagent.formats``) its only
input is Prometheus's HTTP API: it never imports the agent's sources or consumers. Reference:
``docs/recommend.md``.
"""
