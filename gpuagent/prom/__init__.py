"""Reading the agents' series back from Prometheus: the pieces ``gpuagent report``, ``gpuagent recommend``
and ``gpuagent top``'s cluster view share.

A small client of Prometheus's HTTP API (``client``; Thanos, Mimir, Cortex and VictoriaMetrics speak it too),
the PromQL of the accounting counters (``queries``), time ranges and their chunks (``timerange``), the query
plan with its progress line (``plan``, ``progress``), prices (``prices``), the command-line argument groups
that name all of these (``cliargs``), and the one error type every failure becomes (``errors``). It sits
below the three commands, which never import one another; like them it never imports the agent's code.
"""
