"""DRA: which GPU or MIG instance each device of a pod's ResourceClaims is.

The kubelet names a DRA device by its driver, pool and device name (``gpu.nvidia.com``, the node, ``gpu-3``)
and the CDI device names the runtime injected; attribution, labels, accounting and hints speak GPU and MIG
UUIDs. This package maps one to the other from two sources, never by guessing:

- ``slices``: the driver's ResourceSlices for this node from the API server, whose devices carry a ``uuid``
  attribute (and ``parentUUID`` and ``profile`` for MIG devices);
- ``cdi`` and ``nvcaps``: what the node holds without the API server, the CDI spec files the driver writes
  for each claim (``/var/run/cdi``, ``/etc/cdi``), whose device nodes name the GPU (``/dev/nvidia3``: the GPU
  with minor number 3) and, for a MIG device, its GPU and compute instances
  (``/dev/nvidia-caps/nvidia-cap<N>``, resolved through the driver's ``mig-minors`` table), or whose
  ``NVIDIA_VISIBLE_DEVICES`` lists UUIDs.

``mapper`` turns the kubelet's DRA devices into the same allocation records the device plugin's ids give,
and reports every device it cannot map, with the reason. The reference is ``docs/dra.md``.
"""
