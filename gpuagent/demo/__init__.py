"""``gpuagent demo``: the agent on a simulated Kubernetes GPU node, its pods served as a real node serves.

A scenario's ``pods:`` (``examples/scenarios/demo-k8s-node.yaml``) are served through the three sources the
agent reads on a kubelet node, each of them the demo's own: the kubelet's pod-resources gRPC API on a unix
socket (:mod:`.kubelet`, from the same ``api.proto`` as the agent's client), the API server's pods of the
node and their owners (:mod:`.apiserver`, the JSON the agent's lightkube watch and owner walk read) and a
``/proc`` tree whose ``<pid>/cgroup`` and ``<pid>/environ`` put each simulated process in its pod's
container (:mod:`.proc`). The agent itself is ``gpuagent run`` unchanged, on the simulated NVML, pointed at
them: every line of its attribution, enforcement (in audit mode) and accounting is the production code's.
Feeding the pods source directly would have been shorter and would have skipped exactly the parts a user
wants to see work (the join of kubelet, cgroup and API server, the owner walk behind ``recommend``).

:mod:`.node` derives what those sources serve from the scenario (UIDs, container IDs, device IDs);
:mod:`.run` starts the servers on a thread of their own and runs the agent.
"""
