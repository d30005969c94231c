"""The deployment assets: deploy/*.yaml, systemd/gpuagent.service (+ .env), Dockerfile and .dockerignore.

- Kubernetes manifests are validated offline against the Kubernetes OpenAPI schemas with
  ``kubernetes-validate`` (strict: an unknown field is an error) for the oldest and newest versions we
  support; the Prometheus Operator's ServiceMonitor (not core Kubernetes) and the Kustomization are
  checked with our own minimal JSON schemas. Then the cross-references no schema sees: names, labels, ports, probe
  paths, env names and values against ``gpuagent.config``, RBAC verbs, mounts against the config keys.
- The systemd unit is checked with ``systemd-analyze verify`` (on a temporary copy whose ExecStart
  names this venv's ``gpuagent``: verify requires the binary to exist) and ``systemd-analyze security``,
  and its directives are read from the committed file.
- No Docker engine runs here: the Dockerfile is checked statically (stages, user, ports, entrypoint,
  env) and its HEALTHCHECK command is run against a local HTTP server.
"""

from __future__ import annotations

import copy
import http.server
import json
import posixpath
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuagent.config import CONFIG_ENV, KEYS, NODE_NAME_ENV, Config, load_config
from gpuagent.shutdown import BACKSTOP_GRACE_SECONDS

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNIT = ROOT / "systemd" / "gpuagent.service"
ENV_FILE = ROOT / "systemd" / "gpuagent.env"
DOCKERFILE = ROOT / "Dockerfile"



def _pyproject() -> dict[str, str]:
    """The few [project] values checked here (tomllib is 3.11+, the package supports 3.10)."""
    text = (ROOT / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    values = dict(re.findall(r'^([\w-]+) = "([^"]*)"', project, flags=re.MULTILINE))
    scripts = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    values["scripts"] = " ".join(re.findall(r"^([\w-]+) = ", scripts, flags=re.MULTILINE))
    return values


PYPROJECT = _pyproject()
VERSION = PYPROJECT["version"]
NAMESPACE = "gpuagent"
DEFAULT = Config.from_flat({"hostname": "test-node"})
AGENT_PORT = DEFAULT.server.listen_port  # 9402
KEY_ENVS = {key.env for key in KEYS}
# The agent's shutdown after SIGTERM: thaw (immediate), then everything else within shutdown_timeout, and
# faulthandler's backstop a little after; the grace periods must cover that with room to spare.
SHUTDOWN_BOUND_SECONDS = DEFAULT.server.shutdown_timeout + BACKSTOP_GRACE_SECONDS + 10

# The least privilege of the node agent: (API group, resource, verb).
AGENT_RBAC = {
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/eviction", "create"),
    ("", "events", "create"),
    ("events.k8s.io", "events", "create"),
    # the owners walked above a pod (gpuagent.pods.owners.WALKED), one GET each
    ("apps", "replicasets", "get"),
    ("apps", "deployments", "get"),
    ("apps", "statefulsets", "get"),
    ("batch", "jobs", "get"),
    ("resource.k8s.io", "resourceslices", "get"),
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "resourceslices", "watch"),
    # its node's GPUNodeState, by server-side apply (which needs both verbs)
    ("gpuagent.io", "gpunodestates", "create"),
    ("gpuagent.io", "gpunodestates", "patch"),
    # health_mode enforce: its node's GPU conditions (status), taint, cordon and annotations
    ("", "nodes", "get"),
    ("", "nodes", "patch"),
    ("", "nodes/status", "patch"),
}
NOT_CORE = {"ServiceMonitor", "Kustomization"}


# --- loading ------------------------------------------------------------------------------------------------


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
DOCS = {path.name: _load(path) for path in MANIFESTS}


def _all_docs() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, docs in DOCS.items():
        for doc in docs:
            yield name, doc


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [doc for _, doc in _all_docs()
             if doc.get("kind") == kind and (name is None or doc.get("metadata", {}).get("name") == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''} in deploy/, found {len(found)}"
    return found[0]


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    containers = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(containers) == 1, f"no container {name} in {workload['metadata']['name']}"
    return containers[0]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])}


def _mount_for(workload: dict[str, Any], container: dict[str, Any], path: str) -> tuple[dict, dict]:
    """The volumeMount under which ``path`` lies (the deepest), and its volume."""
    mounts = [m for m in container["volumeMounts"]
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{path} is under no volumeMount of {container['name']}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    return mount, volumes[mount["name"]]


@pytest.fixture
def daemonset() -> dict[str, Any]:
    return _one("DaemonSet", "gpuagent")


@pytest.fixture
def agent_container(daemonset: dict[str, Any]) -> dict[str, Any]:
    return _container(daemonset, "gpuagent")


# --- schemas ------------------------------------------------------------------------------------------------


def test_the_manifests_are_there_and_every_document_names_its_kind() -> None:
    names = {path.name for path in MANIFESTS}
    assert {"namespace.yaml", "rbac.yaml", "daemonset.yaml", "service.yaml", "servicemonitor.yaml"} <= names
    for name, doc in _all_docs():
        assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), name
        if doc["kind"] != "Kustomization":
            assert doc["metadata"]["name"], name
            if doc["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                                   "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}:
                assert doc["metadata"].get("namespace") == NAMESPACE, f"{name}: {doc['kind']} outside {NAMESPACE}"


def _kubernetes_validate() -> Any:
    return pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (test extra)")


def _k8s_versions() -> list[str]:
    try:
        import kubernetes_validate.utils as kv
    except ImportError:
        return ["1.30"]
    return sorted({"1.30", kv.major_minor(kv.latest_version())})


CORE_DOCS = [
    pytest.param(doc, id=f"{name}:{doc['kind']}/{doc['metadata']['name']}")
    for name, doc in _all_docs() if doc["kind"] not in NOT_CORE
]
# The scheduler extender's manifests (deploy/extender/; their cross-references: tests/test_extender_deploy.py).
CORE_DOCS += [
    pytest.param(doc, id=f"extender/{path.name}:{doc['kind']}/{doc['metadata']['name']}")
    for path in sorted((DEPLOY / "extender").glob("*.yaml")) for doc in _load(path)
    if doc["kind"] not in NOT_CORE | {"KubeSchedulerConfiguration"}
]


@pytest.mark.parametrize("version", _k8s_versions())
@pytest.mark.parametrize("doc", CORE_DOCS)
def test_core_manifests_validate_against_the_kubernetes_openapi_schemas(doc: dict, version: str) -> None:
    kv = _kubernetes_validate()
    try:
        kv.validate(doc, version, strict=True)
    except kv.ValidationError as err:
        where = ".".join(str(part) for part in err.path)
        pytest.fail(f"not valid for Kubernetes {err.version}: {where}: {err.message}")
    except kv.SchemaNotFoundError as err:
        pytest.fail(err.message)


def test_the_validator_is_strict_so_a_typo_cannot_pass(daemonset: dict[str, Any]) -> None:
    kv = _kubernetes_validate()
    typo = copy.deepcopy(daemonset)
    typo["spec"]["template"]["spec"]["hostPid"] = True  # hostPID, misspelt
    with pytest.raises(kv.ValidationError):
        kv.validate(typo, "1.30", strict=True)
    wrong_type = copy.deepcopy(daemonset)
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "60"
    with pytest.raises(kv.ValidationError):
        kv.validate(wrong_type, "1.30", strict=True)


_DURATION = r"^[0-9]+(ms|s|m|h)$"
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICEMONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object", "required": ["name", "namespace"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _LABELS},
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "required": ["matchLabels"],
                             "properties": {"matchLabels": _LABELS}},
                "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "matchNames": {"type": "array", "items": {"type": "string"}},
                    "any": {"type": "boolean"}}},
                "jobLabel": {"type": "string"},
                "endpoints": {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object", "required": ["port"], "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": {
                                "type": "object", "additionalProperties": False,
                                "properties": {
                                    "action": {"enum": ["replace", "keep", "drop", "labeldrop", "labelkeep",
                                                        "labelmap", "hashmod", "lowercase", "uppercase"]},
                                    "sourceLabels": {"type": "array", "items": {"type": "string"}},
                                    "separator": {"type": "string"},
                                    "targetLabel": {"type": "string"},
                                    "regex": {"type": "string"},
                                    "replacement": {"type": "string"},
                                    "modulus": {"type": "integer"},
                                }}},
                        },
                    },
                },
            },
        },
    },
}

KUSTOMIZATION_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "resources"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "kustomize.config.k8s.io/v1beta1"},
        "kind": {"const": "Kustomization"},
        "resources": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
}


@pytest.mark.parametrize(("kind", "schema"), [
    ("ServiceMonitor", SERVICEMONITOR_SCHEMA),
    ("Kustomization", KUSTOMIZATION_SCHEMA),
])
def test_documents_outside_core_kubernetes_match_their_minimal_schema(kind: str, schema: dict) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(_one(kind)))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_every_document_kind_is_checked_by_some_schema() -> None:
    kinds = {doc["kind"] for _, doc in _all_docs()}
    core = kinds - NOT_CORE
    assert core <= {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                    "ConfigMap", "DaemonSet", "Deployment", "Service", "CustomResourceDefinition",
                    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, \
        "a new kind: make sure kubernetes-validate has its schema"


# --- the node agent -----------------------------------------------------------------------------------------


def test_namespace_exists_and_admits_what_the_daemonset_needs() -> None:
    namespace = _one("Namespace", NAMESPACE)
    # hostPID and hostPath volumes are only admitted at Pod Security's "privileged" level.
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_daemonset_service_account_exists_and_is_bound_to_the_least_privilege_role(daemonset: dict) -> None:
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    assert _one("ServiceAccount", account)["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    binding = _one("ClusterRoleBinding", "gpuagent")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpuagent"}
    role = _one("ClusterRole", binding["roleRef"]["name"])
    granted = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames/nonResourceURLs/wildcards"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb)
                    granted.add((group, resource, verb))
    assert granted == AGENT_RBAC
    # Only the node agent holds a role: nothing else in deploy/ is bound to anything.
    assert [doc["metadata"]["name"] for _, doc in _all_docs() if doc["kind"] in {"ClusterRoleBinding", "RoleBinding"}] == [
        "gpuagent", "gpuagent-quarantine-budget"]


def test_the_quarantine_budget_role_grants_its_one_lease_in_the_agents_namespace(daemonset: dict) -> None:
    from gpuagent.config import Config
    from gpuagent.health.budget import LEASE_NAME

    role = _one("Role", "gpuagent-quarantine-budget")
    assert role["metadata"]["namespace"] == NAMESPACE == Config().health.budget_namespace
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE_NAME],
         "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]
    binding = _one("RoleBinding", "gpuagent-quarantine-budget")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] and binding["roleRef"]["kind"] == "Role"


def test_the_role_allows_a_get_of_every_owner_kind_the_agent_walks() -> None:
    from gpuagent.pods.owners import WALKED

    walked = {(group, path.split("/")[-2], "get") for (group, _), path in WALKED.items()}
    assert walked and walked <= AGENT_RBAC
    assert {r for r in AGENT_RBAC if r[0] in ("apps", "batch")} == walked  # and no more


def test_workload_selectors_match_their_pod_labels(daemonset: dict) -> None:
    for workload in (daemonset,):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()


def _selects(selector: dict[str, str], workload: dict) -> bool:
    return selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def test_services_select_exactly_their_workload_and_target_named_container_ports(daemonset: dict) -> None:
    for service_name, workload, container_name, port in (("gpuagent", daemonset, "gpuagent", AGENT_PORT),):
        service = _one("Service", service_name)
        selector = service["spec"]["selector"]
        assert _selects(selector, workload)
        ports = {p["name"]: p["containerPort"] for p in _container(workload, container_name)["ports"]}
        (service_port,) = service["spec"]["ports"]
        assert service_port["port"] == port
        assert ports[service_port["targetPort"]] == port


def test_metrics_service_is_headless_on_the_agents_default_port() -> None:
    service = _one("Service", "gpuagent")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True  # an agent without NVML is scraped: gpuagent_up 0
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9402, "targetPort": "metrics", "protocol": "TCP"}]
    assert AGENT_PORT == 9402


def test_container_port_is_the_configured_listen_port(agent_container: dict) -> None:
    (port,) = agent_container["ports"]
    assert port["name"] == "metrics" and port["containerPort"] == AGENT_PORT
    assert port["hostPort"] == port["containerPort"]  # the extender's http://{node}:9402
    listen = _env(agent_container).get("GPUAGENT_LISTEN")
    if listen is not None:
        assert load_config(env={"GPUAGENT_LISTEN": listen}).server.listen_port == AGENT_PORT


def _agent_routes() -> set[str]:
    from prometheus_client import CollectorRegistry

    from gpuagent.api.app import build_app

    app = build_app(lambda: None, CollectorRegistry())
    return {resource.canonical for resource in app.router.resources()}


def test_probes_call_endpoints_the_agent_serves(agent_container: dict) -> None:
    routes = _agent_routes()
    ports = {p["name"] for p in agent_container["ports"]} | {p["containerPort"] for p in agent_container["ports"]}
    liveness, readiness = agent_container["livenessProbe"], agent_container["readinessProbe"]
    assert liveness["httpGet"]["path"] == "/healthz"
    assert readiness["httpGet"]["path"] == "/readyz"
    for probe in (liveness, readiness):
        assert probe["httpGet"]["path"] in routes
        assert probe["httpGet"]["port"] in ports
        assert probe.get("timeoutSeconds", 1) < probe.get("periodSeconds", 10)


def test_env_names_are_config_keys_and_values_parse(agent_container: dict) -> None:
    env = _env(agent_container)
    for name in env:
        if name.startswith("GPUAGENT_"):
            assert name in KEY_ENVS | {CONFIG_ENV}, f"{name} is not GPUAGENT_<KEY> for a key of gpuagent.config"
        else:
            assert name in {NODE_NAME_ENV, "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}, name
    assert env[NODE_NAME_ENV] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    plain = {name: value for name, value in env.items() if name in KEY_ENVS}
    config = load_config(env={**plain, NODE_NAME_ENV: "node-1"})
    assert config.agent.hostname == "node-1"
    for name in plain:
        assert config.sources[name.removeprefix("GPUAGENT_").lower()] == f"env {name}"


def test_config_map_is_a_valid_config_file(agent_container: dict, tmp_path: Path) -> None:
    env = _env(agent_container)
    mount, volume = _mount_for(_one("DaemonSet", "gpuagent"), agent_container, env[CONFIG_ENV])
    config_map = _one("ConfigMap", volume["configMap"]["name"])
    assert mount.get("readOnly") is True
    text = config_map["data"][posixpath.basename(env[CONFIG_ENV])]
    path = tmp_path / "config.yaml"
    path.write_text(text)
    plain = {name: value for name, value in env.items() if name in KEY_ENVS}
    config = load_config(env={**plain, CONFIG_ENV: str(path), NODE_NAME_ENV: "node-1"})
    assert config.devices.backend == "nvml"  # never the simulator on a GPU node
    assert config.enforce.mode == "off"  # enforcement is opt-in, see deploy/README.md
    assert not set(yaml.safe_load(text)) & {name.removeprefix("GPUAGENT_").lower() for name in plain}, (
        "a key set both in the ConfigMap and in env: the env value silently wins"
    )


def test_host_paths_are_mounted_where_the_config_says(daemonset: dict, agent_container: dict) -> None:
    env = _env(agent_container)
    expect = {  # key -> (host path, read-only, volume type)
        "GPUAGENT_PROC_ROOT": ("/proc", True, "Directory"),
        "GPUAGENT_CGROUP_ROOT": ("/sys/fs/cgroup", False, "Directory"),  # written in mode enforce
        "GPUAGENT_POD_RESOURCES_SOCKET": ("/var/lib/kubelet/pod-resources", True, "Directory"),
        "GPUAGENT_JOURNAL_PATH": ("/var/lib/gpuagent", False, "DirectoryOrCreate"),
    }
    for name, (host_path, read_only, kind) in expect.items():
        path = env[name]
        mount, volume = _mount_for(daemonset, agent_container, path)
        assert volume["hostPath"]["path"] == host_path, name
        assert volume["hostPath"]["type"] == kind, name
        assert bool(mount.get("readOnly", False)) == read_only, name
        if name in {"GPUAGENT_PROC_ROOT", "GPUAGENT_CGROUP_ROOT"}:
            assert mount["mountPath"] == path, name
    for path, host_path in zip(env["GPUAGENT_CDI_SPEC_DIRS"].split(","), DEFAULT.pods.cdi_spec_dirs, strict=True):
        mount, volume = _mount_for(daemonset, agent_container, path)
        assert (volume["hostPath"]["path"], mount["mountPath"], mount.get("readOnly")) == (host_path, path, True)
        assert volume["hostPath"]["type"] == "DirectoryOrCreate"  # a node without CDI specs yet starts too
    assert env["GPUAGENT_PROC_ROOT"] == "/host/proc"
    assert env["GPUAGENT_POD_RESOURCES_SOCKET"] == DEFAULT.pods.pod_resources_socket
    assert env["GPUAGENT_JOURNAL_PATH"] == DEFAULT.enforce.journal_path  # the same file the systemd unit keeps


def test_daemonset_pod_spec(daemonset: dict, agent_container: dict) -> None:
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork", False)
    assert spec["enableServiceLinks"] is False  # no GPUAGENT_SERVICE_HOST & co. from the Service named gpuagent
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["terminationGracePeriodSeconds"] >= SHUTDOWN_BOUND_SECONDS
    assert agent_container["image"] == f"gpuagent:{VERSION}"
    # the image's `gpuagent run --backend nvml`
    assert "command" not in agent_container and "args" not in agent_container
    resources = agent_container["resources"]
    assert resources["requests"] == {"cpu": "20m", "memory": "64Mi"}
    assert resources["limits"] == {"memory": "256Mi"}  # and no CPU limit: throttling would skew the duty cycle


def test_daemonset_security_context_is_the_minimum(agent_container: dict) -> None:
    context = agent_container["securityContext"]
    assert context["privileged"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["runAsUser"] == 0  # cgroup.freeze belongs to root; see deploy/README.md
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}


# --- Prometheus ---------------------------------------------------------------------------------------------


def test_servicemonitor_scrapes_the_metrics_service_keeping_the_agents_labels() -> None:
    monitor = _one("ServiceMonitor", "gpuagent")
    service = _one("Service", "gpuagent")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["metadata"]["namespace"] in monitor["spec"]["namespaceSelector"]["matchNames"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics" and "/metrics" in _agent_routes()
    assert endpoint["interval"] == "15s"
    assert _seconds(endpoint["scrapeTimeout"]) <= _seconds(endpoint["interval"])
    # honorLabels: the agent's pod/namespace/container labels win over the target's (no exported_pod).
    assert endpoint["honorLabels"] is True
    dropped = [r["regex"] for r in endpoint["relabelings"] if r["action"] == "labeldrop"]
    assert any(all(re.fullmatch(regex, label) for label in ("pod", "namespace", "container")) for regex in dropped)


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"([0-9]+)(ms|s|m|h)", duration)
    assert match, duration
    return int(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def test_kustomization_applies_the_node_agent_only() -> None:
    kustomization = _one("Kustomization")
    for resource in kustomization["resources"]:
        assert (DEPLOY / resource).is_file(), resource
    # Not the ServiceMonitor (it needs the Prometheus operator's CRDs).
    assert set(kustomization["resources"]) == {"namespace.yaml", "gpunodestate-crd.yaml", "rbac.yaml",
                                               "daemonset.yaml", "service.yaml",
                                               "admission-pod-annotations.yaml", "admission-gpunodestate.yaml",
                                               "admission-node.yaml", "admission-lease.yaml"}


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    """What ``kubectl kustomize <directory>`` renders (Debian's kubernetes-client, or any kubectl)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: scripts/install-system-deps.sh (run by `make test`) installs "
                    "Debian's kubernetes-client")
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {directory.relative_to(ROOT)}: {done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


def _identity(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    return (doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])


@pytest.mark.parametrize("directory", ["deploy", "deploy/extender"])
def test_kustomize_renders_the_listed_resources_and_they_validate_strictly(directory: str) -> None:
    """``kubectl apply -k`` is how the README deploys: what kustomize renders (not only the files one by one)
    must be exactly the resources the kustomization lists, each valid for every Kubernetes version we
    support, strictly (an unknown field is an error)."""
    base = ROOT / directory
    rendered = _kustomize(base)
    listed = [doc for name in _load(base / "kustomization.yaml")[0]["resources"] for doc in _load(base / name)]
    assert sorted(map(_identity, rendered)) == sorted(map(_identity, listed))
    kv = _kubernetes_validate()
    for version in _k8s_versions():
        for doc in rendered:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as err:
                where = ".".join(str(part) for part in err.path)
                pytest.fail(f"{directory}: {doc['kind']}/{doc['metadata']['name']} as rendered is not valid "
                            f"for Kubernetes {err.version}: {where}: {err.message}")


def test_a_kustomize_patch_that_breaks_a_manifest_is_caught_as_rendered(tmp_path: Path) -> None:
    """What the check above catches: a patch (as a user's overlay would add) whose result is invalid."""
    overlay = tmp_path / "deploy"
    shutil.copytree(DEPLOY, overlay, ignore=shutil.ignore_patterns("extender"))
    kustomization = _load(overlay / "kustomization.yaml")[0]
    # patchesJson6902: what both Debian's kubectl 1.20 (kustomize 2) and today's kubectl understand.
    (overlay / "typo.yaml").write_text("- op: add\n  path: /spec/template/spec/hostPid\n  value: true\n")
    kustomization["patchesJson6902"] = [{"target": {"group": "apps", "version": "v1", "kind": "DaemonSet",
                                                    "name": "gpuagent"}, "path": "typo.yaml"}]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    rendered = {doc["kind"]: doc for doc in _kustomize(overlay)}
    assert rendered["DaemonSet"]["spec"]["template"]["spec"]["hostPid"] is True  # kustomize applied it
    kv = _kubernetes_validate()
    with pytest.raises(kv.ValidationError):
        kv.validate(rendered["DaemonSet"], "1.30", strict=True)


def test_deploy_readme_documents_every_manifest() -> None:
    text = (DEPLOY / "README.md").read_text()
    for path in MANIFESTS:
        assert path.name in text, f"deploy/README.md does not mention {path.name}"


def _json_patch_replace(doc: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    patched = copy.deepcopy(doc)
    for operation in operations:
        assert operation["op"] == "replace"
        *parents, last = [int(p) if p.isdigit() else p for p in operation["path"].strip("/").split("/")]
        target = patched
        for part in parents:
            target = target[part]
        assert last in target if isinstance(target, dict) else last < len(target), operation["path"]
        target[last] = operation["value"]
    return patched


PATCH_COMMAND = r"kubectl -n gpuagent patch daemonset gpuagent --type=json -p '([^']*)'"


@pytest.mark.parametrize("capability", ["SYS_PTRACE", "SYS_ADMIN"])
def test_readme_capability_patches_apply_and_stay_valid(capability: str, tmp_path: Path) -> None:
    """deploy/README.md's one-line patches that add a capability to the running DaemonSet, applied by kubectl
    itself (``--local``: no cluster) to the shipped manifest: the capability is added beside KILL, nothing
    else changes, and the result is still valid, strictly."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: scripts/install-system-deps.sh (run by `make test`) installs "
                    "Debian's kubernetes-client")
    text = (DEPLOY / "README.md").read_text()
    (patch,) = [p for p in re.findall(PATCH_COMMAND, text) if f'"{capability}"' in p]
    (shipped,) = [doc for doc in _load(DEPLOY / "daemonset.yaml") if doc["kind"] == "DaemonSet"]
    manifest = tmp_path / "daemonset.json"
    manifest.write_text(json.dumps(shipped))
    done = subprocess.run([kubectl, "patch", "--local", "-f", str(manifest), "--type=json", "-p", patch,
                           "-o", "json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    patched = json.loads(done.stdout)
    container = patched["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["KILL", capability]}
    container["securityContext"]["capabilities"]["add"] = ["KILL"]
    assert patched["spec"] == shipped["spec"]
    kv = _kubernetes_validate()
    for version in _k8s_versions():
        kv.validate(patched, version, strict=True)


def test_readme_privileged_patch_applies_and_stays_valid(daemonset: dict) -> None:
    text = (DEPLOY / "README.md").read_text()
    (patch,) = [p for p in re.findall(PATCH_COMMAND, text) if "privileged" in p]
    patched = _json_patch_replace(daemonset, json.loads(patch))
    container = patched["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "gpuagent"
    context = container["securityContext"]
    assert context["privileged"] is True
    # The API server rejects privileged: true with allowPrivilegeEscalation: false.
    assert context["allowPrivilegeEscalation"] is True
    kv = _kubernetes_validate()
    kv.validate(patched, "1.30", strict=True)


# --- systemd ------------------------------------------------------------------------------------------------


def _unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> every value assigned (systemd keys may repeat; an empty value resets)."""
    sections: dict[str, dict[str, list[str]]] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), {})
            continue
        assert section is not None and "=" in line, raw
        key, value = (part.strip() for part in line.split("=", 1))
        values = section.setdefault(key, [])
        if value:
            values.append(value)
        else:
            values.clear()
    return sections


@pytest.fixture
def unit() -> dict[str, dict[str, list[str]]]:
    return _unit(UNIT.read_text())


def _words(values: list[str]) -> set[str]:
    return {word for value in values for word in value.split()}


def test_unit_runs_the_agent_simply_and_restarts_it(unit: dict) -> None:
    service = unit["Service"]
    assert service["Type"] == ["simple"]  # no sd_notify in the agent; readiness is /readyz
    assert service["ExecStart"] == ["/usr/local/bin/gpuagent run --backend nvml"]
    assert service["EnvironmentFile"] == ["-/etc/gpuagent/gpuagent.env"]
    assert service["Restart"] == ["on-failure"]
    assert service["RestartSec"]
    from gpuagent.cli import EXIT_CONFIG_ERROR

    assert service["RestartPreventExitStatus"] == [str(EXIT_CONFIG_ERROR)]  # a bad config does not heal
    assert service["KillMode"] == ["mixed"]
    assert _seconds(service["TimeoutStopSec"][0]) >= SHUTDOWN_BOUND_SECONDS
    assert service["MemoryMax"] == ["256M"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_unit_keeps_the_freeze_journal_in_its_state_directory(unit: dict) -> None:
    service = unit["Service"]
    assert service["StateDirectory"] == ["gpuagent"]
    assert posixpath.dirname(DEFAULT.enforce.journal_path) == "/var/lib/gpuagent"
    assert {"/var/lib/gpuagent", DEFAULT.enforce.cgroup_root} <= _words(service["ReadWritePaths"])


def test_unit_hardening_leaves_what_freezing_signalling_and_nvml_need(unit: dict) -> None:
    service = unit["Service"]
    assert service["ProtectSystem"] == ["strict"]
    for key in ("ProtectHome", "PrivateTmp", "NoNewPrivileges", "ProtectKernelTunables", "LockPersonality"):
        assert service[key] == ["yes"], key
    assert service["SystemCallArchitectures"] == ["native"]
    # Writes cgroup.freeze: cgroupfs must stay writable.
    assert service.get("ProtectControlGroups", ["no"]) == ["no"]
    assert DEFAULT.enforce.cgroup_root in _words(service["ReadWritePaths"])
    # Sees every process (its /proc/PID/cgroup) and NVML's /proc/driver/nvidia; opens /dev/nvidia*.
    assert service.get("ProtectProc", ["default"]) == ["default"]
    assert service.get("ProcSubset", ["all"]) == ["all"]
    assert service.get("PrivateDevices", ["no"]) == ["no"]
    assert service.get("PrivateUsers", ["no"]) == ["no"]  # uid 0 must be the host's: it owns cgroup.freeze
    assert "User" not in service and "DynamicUser" not in service
    # root with CAP_KILL only: no CAP_SYS_ADMIN, no CAP_DAC_OVERRIDE.
    assert _words(service["CapabilityBoundingSet"]) == {"CAP_KILL"}
    assert _words(service.get("AmbientCapabilities", [])) <= {"CAP_KILL"}
    assert service["DevicePolicy"] == ["closed"]
    allowed = dict(value.split() for value in service["DeviceAllow"])
    assert allowed["/dev/nvidiactl"] == "rw"
    assert allowed["char-nvidia-frontend"] == "rw"  # /dev/nvidia[0-9]*, present and future
    assert allowed["char-nvidia-uvm"] == "rw"
    assert allowed["char-nvidia-caps"] == "r"  # /dev/nvidia-caps/* (MIG)
    assert _words(service["RestrictAddressFamilies"]) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    if "SystemCallFilter" in service:
        listed = _systemd_syscalls(service["SystemCallFilter"])
        if listed is not None:
            for call in ("kill", "pidfd_open", "pidfd_send_signal", "ioctl", "mmap", "openat", "write"):
                assert call in listed, f"SystemCallFilter refuses {call}"


def _systemd_syscalls(filters: list[str]) -> set[str] | None:
    """The system calls an allow-list SystemCallFilter admits (None without systemd-analyze)."""
    if shutil.which("systemd-analyze") is None:
        return None
    calls: set[str] = set()
    for value in filters:
        assert not value.startswith("~"), "only allow-lists are checked here"
        for name in value.split():
            if name.startswith("@"):
                out = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True,
                                     text=True, check=True).stdout
                calls |= {line.strip() for line in out.splitlines()[1:] if line.strip()
                          and not line.strip().startswith(("#", "@"))}
                for group in re.findall(r"^\s+(@[\w-]+)", out, flags=re.MULTILINE):
                    calls |= _systemd_syscalls([group]) or set()
            else:
                calls.add(name)
    return calls


def _systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    return path


def _verifiable_copy(tmp_path: Path, extra: str = "") -> Path:
    """The committed unit with ExecStart naming this venv's gpuagent (verify wants the binary to exist)."""
    script = Path(sys.executable).parent / "gpuagent"
    if not script.exists():
        pytest.skip(f"{script} is missing: install the package (pip install -e .)")
    text = UNIT.read_text()
    assert text.count("ExecStart=/usr/local/bin/gpuagent ") == 1
    text = text.replace("ExecStart=/usr/local/bin/gpuagent ", f"ExecStart={script} ")
    if extra:
        text = text.replace("[Service]\n", f"[Service]\n{extra}\n")
    copy_path = tmp_path / "gpuagent.service"
    copy_path.write_text(text)
    return copy_path


def _verify(tmp_path: Path, extra: str = "") -> tuple[int, list[str]]:
    tool = _systemd_analyze()
    unit = _verifiable_copy(tmp_path, extra)
    result = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    lines = (result.stdout + result.stderr).splitlines()
    # Only what concerns this unit: a host's other units may have problems of their own.
    return result.returncode, [line for line in lines if str(unit) in line or "gpuagent.service" in line]


def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    returncode, complaints = _verify(tmp_path)
    assert returncode == 0 and not complaints, "\n".join(complaints)


@pytest.mark.parametrize("extra", ["ProtectHomee=yes", "RestartSec=soon", "KillMode=gently"])
def test_systemd_analyze_verify_would_catch_a_mistake(tmp_path: Path, extra: str) -> None:
    returncode, complaints = _verify(tmp_path, extra)
    assert returncode != 0 or complaints


def test_systemd_analyze_security_exposure_stays_low(tmp_path: Path) -> None:
    tool = _systemd_analyze()
    unit = _verifiable_copy(tmp_path)
    result = subprocess.run([tool, "security", "--offline=true", "--no-pager", str(unit)],
                            capture_output=True, text=True, timeout=60)
    if "--offline" in result.stderr or "unrecognized option" in result.stderr:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    # 0 (locked down) to 10 (unprotected); root with CAP_KILL and a writable cgroupfs is 2.8 today.
    assert float(match.group(1)) <= 3.5


def _env_file() -> tuple[dict[str, str], dict[str, str]]:
    """(active assignments, commented-out example assignments) of systemd/gpuagent.env."""
    active: dict[str, str] = {}
    examples: dict[str, str] = {}
    for raw in ENV_FILE.read_text().splitlines():
        line = raw.strip()
        match = re.fullmatch(r"(#\s*)?([A-Z][A-Z0-9_]*)=(\S*)", line)
        if match:
            (examples if match.group(1) else active)[match.group(2)] = match.group(3)
        else:
            assert not line or line.startswith("#"), f"not KEY=VALUE: {raw!r}"
    return active, examples


def test_env_file_names_real_keys_and_every_example_value_parses(tmp_path: Path) -> None:
    active, examples = _env_file()
    assert active[CONFIG_ENV] == "/etc/gpuagent/config.yaml"
    assert "GPUAGENT_BACKEND" not in active  # the unit's --backend nvml decides, with or without this file
    for name in {**active, **examples}:
        assert name in KEY_ENVS | {CONFIG_ENV}, f"{name} is not GPUAGENT_<KEY> for a key of gpuagent.config"
    empty = tmp_path / "config.yaml"
    empty.write_text("")
    base = {**active, CONFIG_ENV: str(empty), NODE_NAME_ENV: "node-1"}
    load_config(env=base)
    for name, value in examples.items():  # each example, uncommented, is accepted
        load_config(env={**base, name: value})
    assert examples.get("GPUAGENT_JOURNAL_PATH", DEFAULT.enforce.journal_path) == DEFAULT.enforce.journal_path


# --- Dockerfile ---------------------------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if text:
            instruction, _, arguments = text.partition(" ")
            result.append((instruction.upper(), arguments.strip()))
    assert not pending, "a continuation line at the end of the Dockerfile"
    return result


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _global_args() -> dict[str, str]:
    args = {}
    for instruction, arguments in _instructions():
        if instruction == "FROM":
            break
        if instruction == "ARG":
            name, _, default = arguments.partition("=")
            args[name] = default
    return args


def _base_image(from_arguments: str) -> tuple[str, str | None]:
    words = from_arguments.split()
    image = re.sub(r"\$\{?(\w+)\}?", lambda m: _global_args()[m.group(1)], words[0])
    alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
    return image, alias


def _dockerfile_user() -> tuple[int, int]:
    users = [arguments for instruction, arguments in _stages()[-1] if instruction == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and gid.isdigit(), "USER must be numeric, so runAsNonRoot can verify it"
    return int(uid), int(gid)


def _exec_form(arguments: str) -> list[str]:
    value = json.loads(arguments)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def test_dockerfile_is_multi_stage_on_python_slim() -> None:
    stages = _stages()
    assert len(stages) >= 2
    images = [_base_image(stage[0][1]) for stage in stages]
    assert images[0][1] == "builder"
    for image, _ in images:
        assert re.fullmatch(r"python:3\.(\d+)-slim(-\w+)?", image), image
        minor = int(image.split(".")[1].split("-")[0])
        low = re.fullmatch(r">=3\.(\d+)", PYPROJECT["requires-python"])
        assert low and minor >= int(low.group(1)), f"{image} is older than requires-python"
    final = stages[-1]
    copies = [arguments for instruction, arguments in final if instruction == "COPY"]
    assert copies and all(arguments.startswith("--from=builder ") for arguments in copies), (
        "the final stage takes only the builder's venv"
    )
    builder_runs = " ".join(arguments for instruction, arguments in stages[0] if instruction == "RUN")
    assert "pip wheel" in builder_runs and "venv" in builder_runs and ".whl" in builder_runs


def test_dockerfile_runs_gpuagent_unprivileged_on_the_default_port() -> None:
    final = _stages()[-1]
    uid, gid = _dockerfile_user()
    assert uid != 0 and gid != 0
    exposed = [arguments for instruction, arguments in final if instruction == "EXPOSE"]
    assert exposed == [str(AGENT_PORT)]
    (entrypoint,) = [arguments for instruction, arguments in final if instruction == "ENTRYPOINT"]
    assert _exec_form(entrypoint) == ["gpuagent", "run", "--backend", "nvml"]
    assert "gpuagent" in PYPROJECT["scripts"].split()
    env = " ".join(arguments for instruction, arguments in final if instruction == "ENV")
    assert re.search(r"\bNVIDIA_VISIBLE_DEVICES=all\b", env)
    assert re.search(r"\bNVIDIA_DRIVER_CAPABILITIES=utility\b", env)
    assert re.search(r"\bPATH=/opt/gpuagent/bin:", env)


def _healthcheck_command() -> list[str]:
    checks = [arguments for instruction, arguments in _stages()[-1] if instruction == "HEALTHCHECK"]
    assert len(checks) == 1, "one HEALTHCHECK in the final stage"
    options, _, command = checks[0].partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    argv = _exec_form(command)
    assert argv[:2] == ["python", "-c"], "python's urllib: the slim image has no curl or wget"
    assert "/healthz" in argv[2] and "/healthz" in _agent_routes()
    return argv


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = self.status if self.path == "/healthz" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(("family", "host", "listen", "status", "healthy"), [
    (socket.AF_INET, "127.0.0.1", "0.0.0.0:{port}", 200, True),
    (socket.AF_INET, "127.0.0.1", "127.0.0.1:{port}", 200, True),
    (socket.AF_INET, "127.0.0.1", "0.0.0.0:{port}", 503, False),
    (socket.AF_INET6, "::1", "[::]:{port}", 200, True),
])
def test_healthcheck_command_reports_the_agents_healthz(family: int, host: str, listen: str, status: int,
                                                       healthy: bool) -> None:
    argv = _healthcheck_command()

    class Server(http.server.ThreadingHTTPServer):
        address_family = family

    try:
        server = Server((host, 0), type("Handler", (_Health,), {"status": status}))
    except OSError as err:
        pytest.skip(f"cannot listen on {host}: {err}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        env = {"GPUAGENT_LISTEN": listen.format(port=port),
               # a proxy set for the pod must not be asked for the agent's own /healthz
               "http_proxy": "http://192.0.2.1:3128", "HTTP_PROXY": "http://192.0.2.1:3128"}
        result = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert (result.returncode == 0) == healthy, result.stderr


def _dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matches a path or any of its parents."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        parts = path.split("/")
        candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        regex = (re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
                 .replace(r"\*", "[^/]*").replace(r"\?", "[^/]"))
        if any(re.fullmatch(regex, candidate) for candidate in candidates):
            excluded = not negate
    return excluded


def test_dockerignore_sends_only_what_the_builder_copies() -> None:
    copied = []
    for instruction, arguments in _stages()[0]:
        if instruction == "COPY" and not arguments.startswith("--from"):
            copied += arguments.split()[:-1]
    assert set(copied) == {"pyproject.toml", "README.md", "gpuagent"}
    assert PYPROJECT["readme"] in copied  # setuptools reads it to build the wheel
    for source in copied:
        assert (ROOT / source).exists()
        assert not _dockerignore_excludes(source), source
    for kept in ("gpuagent/__init__.py", "gpuagent/devices/sim/schema.json", "gpuagent/config/load.py"):
        assert not _dockerignore_excludes(kept), kept
    for left_out in (".venv/bin/python", ".git/HEAD", "tests/test_deploy.py", "gpuagent/__pycache__/cli.cpython-311.pyc",
                     "deploy/daemonset.yaml", "Dockerfile"):
        assert _dockerignore_excludes(left_out), left_out


# --- production never simulates -------------------------------------------------------------------------

def _backend_of(argv: list[str], env: dict[str, str]) -> str:
    """The backend ``gpuagent ARGV`` runs with under ``env``, parsed and loaded as the command does."""
    from gpuagent.cli import build_parser

    args = build_parser().parse_args(argv)
    return load_config(args.config, overrides={k: getattr(args, k) for k in args.keys}, env=env).devices.backend


def test_every_production_entry_point_requires_nvml_whatever_its_environment(
        unit: dict, daemonset: dict, tmp_path: Path) -> None:
    """The Dockerfile's entrypoint, the unit (with and without its environment file) and the DaemonSet run
    ``--backend nvml``: an environment or config saying auto or sim cannot make them simulate."""
    final = _stages()[-1]
    (entrypoint,) = [arguments for instruction, arguments in final if instruction == "ENTRYPOINT"]
    image = _exec_form(entrypoint)[1:]
    (exec_start,) = unit["Service"]["ExecStart"]
    unit_argv = exec_start.split()[1:]
    config = tmp_path / "config.yaml"
    config.write_text("backend: auto\n")
    active, _ = _env_file()
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    (agent,) = [c for c in containers if c["name"] == "gpuagent"]
    pod_argv = [*image, *agent.get("args", [])]
    for argv in (image, unit_argv, pod_argv):
        for env in ({}, {"GPUAGENT_BACKEND": "auto"}, {"GPUAGENT_BACKEND": "sim"},
                    {CONFIG_ENV: str(config)}, {**active, CONFIG_ENV: str(config)}):
            assert _backend_of(argv, {NODE_NAME_ENV: "node-1", **env}) == "nvml", (argv, env)


def test_no_production_file_names_the_simulator() -> None:
    """No ``auto`` or ``sim`` backend anywhere in what is deployed (a comment may say what they would do)."""
    files = [DOCKERFILE, UNIT, ENV_FILE, *sorted(DEPLOY.rglob("*.yaml"))]
    said = re.compile(r"(--backend[ =]|backend:\s*|GPUAGENT_BACKEND=)[\"']?(auto|sim)\b")
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            assert not said.search(code), f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
