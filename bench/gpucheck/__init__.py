"""``bench/real_gpu.py all``: every check of the real-GPU proof (issue 14) in one command, one report.

A registry of items (``registry``), each a function of a :class:`~gpucheck.context.Context` returning its
checks against their bars; a runner (``runner``) that plans their time, runs each under its own budget and
an overall deadline, and writes ``report.md`` and ``report.json`` (``report``); the tenants (``tenants``:
PyTorch on a GPU, CPU burners in real cgroups on the simulator) and the agent processes (``agents``) they
share. ``docs/real-gpu.md`` says what each item proves and how a session with a lent GPU runs it.
"""
