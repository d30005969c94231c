"""Scheduling hints: capacity, load and fit of GPU requests on this node, from the latest snapshot."""
