"""Isolation: per-pod GPU time-slice shares (cgroup freeze duty cycles) and GPU memory limits (escalation).

A consumer of the snapshot: it never reads NVML, /proc or the kubelet itself. Only ``actions`` writes
cgroupfs, sends signals or calls the Eviction API, and every freeze is journaled before it happens.
"""
