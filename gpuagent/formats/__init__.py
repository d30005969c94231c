"""Output pieces shared by the formats of ``gpuagent report`` and ``gpuagent recommend``: terminal columns
(``layout``), figures written for people (``numbers``), the self-contained HTML page (``page``), its SVG plots
(``svgplot``, the one module here that imports matplotlib) and the check that matplotlib is installed
(``plotting``). Each command's own tables and pages live in its ``formats`` package, built from these.
"""
