"""Read-only attribution: which workload each GPU process belongs to."""
