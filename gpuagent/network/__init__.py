"""The ``network`` source: node links (netlink, via pyroute2), RDMA ports (sysfs) and the traffic of pods'
network namespaces (``/proc/PID/net/dev``), turned into ``snapshot.network.NetworkState`` with bytes/s.

``links`` netlink links and speeds; ``rdma`` /sys/class/infiniband ports; ``podnet`` per-pod netns counters;
``rates`` counters to rates, reset-safe; ``source`` the poll (worker thread, timeout, status). pyroute2 is
imported on the first read only.
"""
