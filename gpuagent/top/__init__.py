"""``gpuagent top``: a live, pod-aware view of a node's GPUs, or of a cluster's nodes, in a terminal.

It reads the agent's HTTP API only (``/v1/state``, ``/healthz``), never NVML nor the agent's code, so it
runs from a laptop against any node; a cluster comes from the extender's agents file or from Prometheus.
The data side (``client``, ``model``, ``arrange``, ``cluster``) needs aiohttp alone; the frames are Rich
text (``render``, ``cluster_view``: ``--once`` prints them); only ``app`` and ``screens`` import Textual.
Both come with the ``top`` extra, and no module of the agent imports this package. See ``docs/top.md``.
"""
