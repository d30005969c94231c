"""gpuagent: node-level GPU monitoring and isolation agent."""

__version__ = "0.1.0"
