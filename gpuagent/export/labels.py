"""The label sets of every per-GPU series, in dcgm-exporter's fixed order, formatted once per snapshot.

dcgm-exporter's families: ``gpu, UUID, pci_bus_id, device, modelName, [GPU_I_PROFILE, GPU_I_ID], <host>,
DCGM_FI_DRIVER_VERSION``. Our ``gpuagent_*`` per-GPU families keep its join keys only (``gpu, UUID,
[GPU_I_PROFILE, GPU_I_ID], <host>``), so ``on(gpu, UUID, Hostname)`` joins them with dcgm's series; the
descriptive labels (``pci_bus_id``, ``device``, ``modelName``) are on ``gpuagent_gpu_info`` alone.

The helpers return label *text* (``{gpu="0",UUID="…",Hostname="…"}``, see ``families.label_text``) in that
order, memoised per snapshot: a GPU's ~40 series share one string, and renderers add their own labels with
``families.join``/``extend``/``with_label``. A label is left out when its value is unknown, except the five
that dcgm-exporter always has.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import TextCache, label_pairs, label_text
from gpuagent.export.held import Held, hold
from gpuagent.snapshot.gpu import GpuInfo, GpuSample, MigSample
from gpuagent.snapshot.node import NodeSnapshot

DRIVER_VERSION = "DCGM_FI_DRIVER_VERSION"
DEFAULT_HOSTNAME_LABEL = "Hostname"  # dcgm-exporter <= 4.5.3-4.8.2; 4.6.0-4.8.3 and later use "hostname"


class GpuLabels:
    """Label texts for the GPUs of one snapshot.

    :meth:`of` shares one instance among every renderer of a scrape, so a GPU's label text is looked up
    once per snapshot and the exclusive owners are worked out once. It lives as long as the snapshot is the
    latest rendered: its memo is bounded by the snapshot's GPUs and instances. The texts themselves are kept
    across snapshots (``_TEXTS``, keyed by what they are made of), so a new snapshot of the same GPUs
    formats none.
    """

    __slots__ = ("_dcgm", "_driver", "_gpu", "_host", "_owner", "_places", "host")

    def __init__(self, snapshot: NodeSnapshot, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> None:
        # An empty hostname_label drops the host label, like dcgm-exporter's --no-hostname.
        self.host = host_labels(snapshot.hostname, hostname_label)  # the node's host label alone
        self._host = (hostname_label, snapshot.hostname) if hostname_label and snapshot.hostname else None
        self._driver = snapshot.driver_version or None
        self._owner = exclusive_owners(snapshot)
        # Memos: GPU index (and GPU instance id) -> text
        self._gpu: dict[int | tuple[int, int], str] = {}
        self._dcgm: dict[int | tuple[int, int], str] = {}
        self._places: dict[tuple[str, int | None], str] | None = None

    _last: tuple[Held, str, GpuLabels] | None = None  # the one most recently built, per process

    @classmethod
    def of(cls, snapshot: NodeSnapshot, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> GpuLabels:
        last = cls._last
        if last is not None and last[0]() is snapshot and last[1] == hostname_label:
            return last[2]
        _TEXTS.rotate()
        labels = cls(snapshot, hostname_label)
        cls._last = (hold(snapshot), hostname_label, labels)
        return labels

    def dcgm(self, gpu: GpuSample, mig: MigSample | None = None) -> str:
        """dcgm-exporter's labels of a GPU or of one of its MIG instances."""
        info = gpu.info
        memo = info.index if mig is None else (info.index, mig.gpu_instance_id)
        text = self._dcgm.get(memo)
        if text is None:
            owner = self._owner.get(mig.uuid if mig is not None else info.uuid, ())
            key = ("dcgm", info.index, info.uuid, info.pci_bus_id, info.name, *_instance(mig), self._host,
                   self._driver, owner)
            text = self._dcgm[memo] = _TEXTS[key]
        return text

    def gpu(self, gpu: GpuSample, mig: MigSample | None = None) -> str:
        """The join keys of a GPU or of one of its MIG instances, for ``gpuagent_*`` series."""
        info = gpu.info
        memo = info.index if mig is None else (info.index, mig.gpu_instance_id)
        text = self._gpu.get(memo)
        if text is None:
            text = self._gpu[memo] = _TEXTS[("gpu", info.index, info.uuid, *_instance(mig), self._host)]
        return text

    def instance(self, gpu: GpuSample, gpu_instance_id: int | None) -> str:
        """The join keys of what runs in ``gpu_instance_id`` (None: the whole GPU)."""
        if gpu_instance_id is None:
            return self.gpu(gpu)
        mig = find_mig(gpu, gpu_instance_id)
        if mig is not None:
            return self.gpu(gpu, mig)
        # An instance the snapshot does not list: keep its id, there is no profile to name.
        return _TEXTS[("gpu", gpu.info.index, gpu.info.uuid, None, str(gpu_instance_id), self._host)]

    def instances(self, gpu: GpuSample) -> dict[int | None, str]:
        """``instance``'s text of the GPU (key None) and of each of its MIG instances (by GPU instance id)."""
        texts: dict[int | None, str] = {None: self.gpu(gpu)}
        for mig in gpu.migs:
            if mig.gpu_instance_id not in texts:  # as find_mig: the first instance of an id
                texts[mig.gpu_instance_id] = self.gpu(gpu, mig)
        return texts

    def places(self, snapshot: NodeSnapshot) -> dict[tuple[str, int | None], str]:
        """``instances`` of every GPU of the snapshot (of a UUID, the last GPU), keyed by (UUID, GPU instance
        id or None): one lookup for renderers of many rows."""
        if self._places is None:
            by_uuid = {g.info.uuid: g for g in snapshot.gpus}
            self._places = {
                (uuid, instance): text
                for uuid, gpu in by_uuid.items()
                for instance, text in self.instances(gpu).items()
            }
        return self._places


def _instance(mig: MigSample | None) -> tuple[str | None, str | None]:
    """A MIG instance's profile and GPU instance id, as they are labelled (None, None for a whole GPU)."""
    return (None, None) if mig is None else (mig.profile, str(mig.gpu_instance_id))


def _label_text(key: tuple) -> str:
    """The label text of a GPU (or instance) key of ``GpuLabels``: dcgm-exporter's labels in its order
    (``dcgm``), or our join keys (``gpu``); the MIG labels only for an instance (an instance the snapshot
    does not list has an id and no profile), then the host label, the driver and an exclusive owner's
    ``container, namespace, pod`` where there are."""
    if key[0] == "dcgm":
        _, index, uuid, pci_bus_id, name, profile, instance_id, host, driver, owner = key
        labels = {"gpu": str(index), "UUID": uuid, **_descriptive(index, pci_bus_id, name)}
    else:
        _, index, uuid, profile, instance_id, host = key
        driver, owner = None, ()
        labels = {"gpu": str(index), "UUID": uuid}
    if profile is not None:
        labels["GPU_I_PROFILE"] = profile
    if instance_id is not None:
        labels["GPU_I_ID"] = instance_id
    if host is not None:
        labels[host[0]] = host[1]
    if driver is not None:
        labels[DRIVER_VERSION] = driver
    labels.update(owner)
    return label_text(labels)


_TEXTS = TextCache(_label_text)  # GPU and instance label texts of every GpuLabels, across snapshots


def host_labels(hostname: str | None, hostname_label: str) -> str:
    """The node's host label as text ("" without a hostname or with the label turned off)."""
    return label_text({hostname_label: hostname}) if hostname_label and hostname else ""


def exclusive_owners(snapshot: NodeSnapshot) -> dict[str, tuple[tuple[str, str], ...]]:
    """Device UUID -> ``container, namespace, pod`` for devices the kubelet gave to exactly one container.

    dcgm-exporter labels a GPU's series with the pod it was allocated to. For a shared GPU (time-slicing or
    MPS replicas ``GPU-…::n``, or several pods) it picks whichever pod came last; we label none, and the
    per-pod split is in ``gpuagent_pod_gpu_*``.
    """
    holders: dict[str, list[tuple[str, str, str, bool]]] = {}
    for pod in snapshot.pods:
        if pod.namespace is None:
            continue
        for container in pod.containers:
            for device_id in container.allocated_devices:
                base, _, replica = device_id.partition("::")
                holders.setdefault(base, []).append((container.name, pod.namespace, pod.name, bool(replica)))
    return {
        device: (("container", c), ("namespace", ns), ("pod", name))
        for device, entries in holders.items()
        if len(entries) == 1
        for c, ns, name, replica in entries
        if not replica
    }


def pod_labels(namespace: str | None, pod: str) -> str:
    """``namespace, pod`` of a pod as label text (a pod known only by its UID has no namespace label)."""
    return label_pairs((("namespace", namespace), ("pod", pod)) if namespace else (("pod", pod),))


def describe(info: GpuInfo) -> dict[str, str]:
    """dcgm-exporter's descriptive labels of a GPU."""
    return _descriptive(info.index, info.pci_bus_id, info.name)


def _descriptive(index: int, pci_bus_id: str, name: str) -> dict[str, str]:
    return {"pci_bus_id": pci_bus_id, "device": f"nvidia{index}", "modelName": name}


def find_mig(gpu: GpuSample, gpu_instance_id: int) -> MigSample | None:
    for mig in gpu.migs:
        if mig.gpu_instance_id == gpu_instance_id:
            return mig
    return None


class GpuRenderer:
    """Base of per-GPU renderers: nothing before the first poll, labels memoised for one scrape."""

    name = ""

    def __init__(self, *, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> None:
        self._hostname_label = hostname_label

    def render(self, snapshot: NodeSnapshot | None) -> list[Metric]:
        if snapshot is None:
            return []
        return self.families(snapshot, GpuLabels.of(snapshot, self._hostname_label))

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        raise NotImplementedError
