"""deploy/extender/: what no schema sees (the OpenAPI validation is in test_deploy.py's core manifests).

Names, labels and ports between the Deployment, its Service, the agents' DaemonSet and the scheduler's
config; env names and values against the extender's options; the KubeSchedulerConfiguration's extender entry
field by field (``k8s.io/kube-scheduler/config/v1`` Extender json tags and validation).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gpuagent.cli import build_parser
from gpuagent.hints.agents import AgentCache, AgentDirectory
from gpuagent.hints.extender import Extender
from gpuagent.hints.extender_app import build_app, build_registry
from gpuagent.hints.extender_config import OPTION_KEYS, load_options

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
EXTENDER_DIR = DEPLOY / "extender"
NAMESPACE = "gpuagent"

# k8s.io/kube-scheduler/config/v1 Extender json tags.
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
    "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}
# An extended resource name: a domain-prefixed name outside kubernetes.io (validation.IsExtendedResourceName).
EXTENDED_RESOURCE = re.compile(r"^(?!(?:[a-z0-9.-]*\.)?kubernetes\.io/)[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]"
                               r"([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _one(path: Path, kind: str) -> dict[str, Any]:
    found = [doc for doc in _load(path) if doc.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} in {path.name}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def deployment() -> dict[str, Any]:
    return _one(EXTENDER_DIR / "extender.yaml", "Deployment")


@pytest.fixture(scope="module")
def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


@pytest.fixture(scope="module")
def service() -> dict[str, Any]:
    return _one(EXTENDER_DIR / "extender.yaml", "Service")


@pytest.fixture(scope="module")
def options(container: dict[str, Any]) -> Any:
    env = {item["name"]: item["value"] for item in container["env"]}
    return load_options(None, env=env)


@pytest.fixture(scope="module")
def entry() -> dict[str, Any]:
    config = _one(EXTENDER_DIR / "kube-scheduler-config.yaml", "KubeSchedulerConfiguration")
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    (only,) = config["extenders"]
    return only


def test_every_document_is_in_the_namespace_and_kustomized() -> None:
    for path in EXTENDER_DIR.glob("*.yaml"):
        for doc in _load(path):
            if doc["kind"] not in {"Kustomization", "KubeSchedulerConfiguration", "ClusterRole",
                                   "ClusterRoleBinding"}:  # cluster-scoped: no namespace
                assert doc["metadata"]["namespace"] == NAMESPACE, (path.name, doc["kind"])
    kustomization = _one(EXTENDER_DIR / "kustomization.yaml", "Kustomization")
    assert kustomization["resources"] == ["extender.yaml"]  # never the scheduler's own config file


def test_readme_documents_every_file() -> None:
    text = (EXTENDER_DIR / "README.md").read_text()
    for path in EXTENDER_DIR.glob("*.yaml"):
        assert path.name in text, path.name


def test_service_selects_exactly_the_extender_pods(deployment: dict, service: dict, container: dict) -> None:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    assert service["spec"]["selector"] == labels
    agent_service = _one(DEPLOY / "service.yaml", "Service")
    assert not set(agent_service["spec"]["selector"].items()) <= set(labels.items()), \
        "the agents' Service would select the extender pods"
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}


def test_env_names_are_extender_options_and_values_load(container: dict, options: Any) -> None:
    names = {key.env for key in OPTION_KEYS}
    for item in container["env"]:
        assert item["name"] in names, item["name"]
    (port,) = container["ports"]
    assert options.listen_port == port["containerPort"]
    # The template reaches the agents' hostPort.
    daemonset = _one(DEPLOY / "daemonset.yaml", "DaemonSet")
    agent_ports = {p.get("hostPort") for c in daemonset["spec"]["template"]["spec"]["containers"]
                   for p in c.get("ports", [])}
    assert urlsplit(options.agent_url.replace("{node}", "node")).port in agent_ports
    assert options.refresh_interval < options.max_age


def test_command_runs_the_extender_and_the_probes_hit_its_routes(container: dict) -> None:
    assert container["command"] == ["gpuagent", "extender"]
    build_parser().parse_args(["extender"])  # the verb exists
    extender = Extender(AgentCache(AgentDirectory()))
    app = build_app(extender, build_registry(extender))
    paths = {route.resource.canonical for route in app.router.routes() if route.method == "GET"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] in paths


def test_the_extender_runs_unprivileged_reading_claims_and_node_names_only(deployment: dict, container: dict) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True  # to read DRA pods' ResourceClaims and list nodes
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    sa = _one(EXTENDER_DIR / "extender.yaml", "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["automountServiceAccountToken"] is False  # other pods of the account get no token
    binding = _one(EXTENDER_DIR / "extender.yaml", "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    role = _one(EXTENDER_DIR / "extender.yaml", "ClusterRole")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == {("resource.k8s.io", "resourceclaims", "get"),
                       ("resource.k8s.io", "resourceclaimtemplates", "get"),
                       ("gpuagent.io", "gpunodestates", "get"), ("gpuagent.io", "gpunodestates", "list"),
                       ("gpuagent.io", "gpunodestates", "watch"),
                       ("", "nodes", "list"), ("", "nodes", "watch")}
    assert not any(doc["kind"] in {"Role", "RoleBinding"} for doc in _load(EXTENDER_DIR / "extender.yaml"))


def test_scheduler_entry_fields_are_kube_schedulers(entry: dict) -> None:
    assert set(entry) <= EXTENDER_FIELDS, set(entry) - EXTENDER_FIELDS
    assert entry["filterVerb"] == "filter" and entry["prioritizeVerb"] == "prioritize"
    assert isinstance(entry["weight"], int) and entry["weight"] > 0  # required with a prioritizeVerb
    assert "bindVerb" not in entry and "preemptVerb" not in entry
    assert entry["ignorable"] is True  # a down extender must not stop scheduling
    assert entry["nodeCacheCapable"] is True
    assert re.fullmatch(r"[0-9]+(ms|s|m)", entry["httpTimeout"])
    names = [resource["name"] for resource in entry["managedResources"]]
    assert len(names) == len(set(names)), "kube-scheduler rejects duplicate managedResources"
    assert "nvidia.com/gpu" in names
    for resource in entry["managedResources"]:
        assert set(resource) <= {"name", "ignoredByScheduler"}
        assert EXTENDED_RESOURCE.match(resource["name"]), resource["name"]
        assert resource["ignoredByScheduler"] is False


def test_scheduler_url_reaches_the_service_and_prefix(entry: dict, service: dict, options: Any) -> None:
    url = urlsplit(entry["urlPrefix"])
    assert url.scheme == "http" and entry["enableHTTPS"] is False
    assert url.hostname == f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    assert url.port == service["spec"]["ports"][0]["port"]
    assert url.path.rstrip("/") == options.url_prefix
