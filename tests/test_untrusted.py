"""Strings from outside, at every sink (``gpuagent.untrusted``): hostile inputs of each class, and a property
test per sink.

Classes: terminal escapes (CSI clear screen, OSC window title, cursor moves), bidi overrides and isolates,
NUL/BEL/CR/DEL and the C1 controls (0x80-0x9f, 8-bit CSI among them), line separators, lone surrogates (bytes
that were not UTF-8), path traversal (``..``, absolute, percent-encoded, NUL, over-long), newlines that would
end a YAML comment, and formula prefixes. Sinks: the terminal (tables, ``top``, log lines), CSV cells,
Kubernetes names and patch files, YAML, and the exposition's label values.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from snapshots import two_gpu_node
from test_recommend import MIG, SHARE, result, row_of
from test_top_view import tenants_state

from gpuagent.cli import ShownFormatter
from gpuagent.cli_table import format_table
from gpuagent.devices.procnames import ProcessNames
from gpuagent.export import build_registry
from gpuagent.export.exposition import generate_openmetrics, generate_text
from gpuagent.pods.attribution import _workload
from gpuagent.pods.cgroup import parse_proc_cgroup
from gpuagent.prom.cliargs import job_matchers
from gpuagent.prom.prices import Prices
from gpuagent.prom.timerange import TimeRange
from gpuagent.recommend.formats.csv_rows import render_csv as recommend_csv
from gpuagent.recommend.formats.table import render_table as recommend_table
from gpuagent.recommend.model import Action, Recommendation, WorkloadKey
from gpuagent.recommend.patches import Refused, patch_for, write_patches
from gpuagent.report.formats.csv_rows import render_csv as report_csv
from gpuagent.report.formats.table import render_table as report_table
from gpuagent.report.model import NamespaceRow, PodRow, Report, Timeline, Usage, WorkloadRow
from gpuagent.snapshot.processes import ProcessSample
from gpuagent.top import render
from gpuagent.top.arrange import ViewOptions, arrange
from gpuagent.top.client import OK, AgentStatus
from gpuagent.top.history import History
from gpuagent.top.model import node_view
from gpuagent.untrusted import csv_cell, has_unsafe, k8s_name_problem, path_inside, shown, yaml_comment

# One of each class; the first three are the issue's.
ESCAPES = {
    "csi clear screen": "\x1b[2J\x1b[H",
    "osc window title": "\x1b]0;pwned\x07",
    "csi colour and cursor": "\x1b[31m\x1b[10;10H",
    "8-bit csi (c1)": "\x9b2J",
    "bidi override": "evil\u202etxt.exe",
    "bidi isolate": "\u2066admin\u2069",
    "marks": "\u200e\u200f\u061c",
    "nul bel cr del": "a\x00b\x07c\rd\x7f",
    "c1 nel": "x\x85y",
    "line separator": "x\u2028y\u2029z",
    "newline and tab": "x\ny\tz",
    "lone surrogate": "bad\udcffutf8",
}
UNSAFE_CHARS = [*(chr(c) for c in range(0x20)), *(chr(c) for c in range(0x7f, 0xa0)), "\u061c", "\u200e", "\u200f",
                "\u2028", "\u2029", *(chr(c) for c in range(0x202a, 0x202f)), *(chr(c) for c in range(0x2066, 0x206a))]
# hostile names: any character (surrogates too), the unsafe ones often
HOSTILE = st.text(st.one_of(st.characters(exclude_categories=()), st.sampled_from(UNSAFE_CHARS)), max_size=40)
FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def raw_controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on (a line break between lines is the sink's own)."""
    return [c for c in text if c != "\n" and has_unsafe(c)]


# -- the rule itself ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_shown_makes_every_class_visible(name: str) -> None:
    text = ESCAPES[name]
    out = shown(text)
    assert raw_controls(out) == [] and "\n" not in out
    assert out != text and "\\" in out


def test_shown_spells_the_escapes_out_and_keeps_ordinary_names() -> None:
    assert shown("\x1b]0;pwned\x07") == "\\x1b]0;pwned\\x07"
    assert shown("evil\u202etxt") == "evil\\u202etxt"
    assert shown("a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert shown("\x9b\udcff") == "\\x9b\\udcff"
    for ordinary in ("llm-api-7d9c6b8f5d-x2k4p", "python train.py", "wörker ✓", "日本語", "C:\\path", ""):
        assert shown(ordinary) == ordinary


@FAST
@given(HOSTILE)
def test_shown_never_leaves_a_control_and_is_stable(text: str) -> None:
    out = shown(text)
    assert not has_unsafe(out) and shown(out) == out
    assert not any(c in out for c in UNSAFE_CHARS)


# -- CSV ----------------------------------------------------------------------------------------------------

FORMULAS = ["=cmd|' /C calc'!A0", "=HYPERLINK(\"http://x\",\"y\")", "@SUM(1+1)*cmd|' /C calc'!A0", "+1+1",
            "-2+3", "\t=1", "\r=1", "  =1+1", "\uff1d1+1", "\uff20SUM(A1)"]


@pytest.mark.parametrize("cell", FORMULAS)
def test_a_formula_cell_is_neutralised(cell: str) -> None:
    assert csv_cell(cell) == "'" + cell


@pytest.mark.parametrize("cell", ["llm-api", "GPU-1234", "a=b", "x+y", "", "'quoted"])
def test_other_cells_stay_as_they_are(cell: str) -> None:
    assert csv_cell(cell) == cell


FORMULA_STARTS = tuple("=+-@\t\r\uff1d\uff0b\uff0d\uff20")
NAMES = st.one_of(HOSTILE, st.sampled_from(FORMULAS), st.builds(lambda f, t: f + t, st.sampled_from(FORMULAS), HOSTILE))
SPAN = TimeRange(1_714_521_600.0, 1_714_608_000.0)


def hostile_report(namespace: str, pod: str, kind: str, workload: str) -> Report:
    usage = Usage(allocated_gpu_seconds=3600.0, busy_gpu_seconds=-1.5, idle_gpu_seconds=0.0,
                  memory_byte_seconds=0.0, energy_joules=None)
    return Report("http://prometheus:9090", SPAN, 86400.0, 5, (NamespaceRow(namespace, usage, 1),),
                  (PodRow(namespace, pod, usage),), (WorkloadRow(kind, workload, usage),), usage, Timeline(3600.0),
                  Prices(), selector='job=~"gpuagent"', warnings=(f"odd name {pod}",))


def cells_of(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


@FAST
@given(NAMES, NAMES, NAMES, NAMES)
def test_report_csv_cells_never_start_a_formula_and_figures_stay_numbers(namespace: str, pod: str, kind: str,
                                                                        workload: str) -> None:
    rows = cells_of(report_csv(hostile_report(namespace, pod, kind, workload)))
    for row in rows:
        for column in ("namespace", "pod", "workload_kind", "workload"):
            assert not row[column].startswith(FORMULA_STARTS) and not row[column].lstrip().startswith(FORMULA_STARTS)
        assert float(row["allocated_gpu_hours"]) == 1.0 and float(row["busy_gpu_hours"]) < 0  # -1.5 s, a number
    assert rows[1]["pod"] in (pod, "'" + pod)  # the name itself, after the quote if it needed one


@FAST
@given(NAMES, NAMES)
def test_recommend_csv_cells_never_start_a_formula(name: str, model: str) -> None:
    row = row_of(SHARE, WorkloadKey("serving", "Deployment", name), gpu_model=model, pods=(name,),
                 containers=(model,))
    (line,) = cells_of(recommend_csv(result([row])))
    for column, cell in line.items():
        if column in ("workload", "name", "gpu_model", "pods", "containers", "namespace", "kind"):
            assert not cell.lstrip().startswith(FORMULA_STARTS), (column, cell)
    assert float(line["gpus_held"]) == 1.0


# -- Kubernetes names and paths -----------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "name"), [
    ("Namespace", "serving"), ("Namespace", "a" * 63), ("Deployment", "llm-api.v2"), ("Deployment", "a" * 253),
    ("CronJob", "a" * 52), ("Container", "vllm-0"),
])
def test_names_kubernetes_accepts(kind: str, name: str) -> None:
    assert k8s_name_problem(kind, name) is None


@pytest.mark.parametrize(("kind", "name"), [
    ("Namespace", "../../tmp/x"), ("Namespace", "/etc"), ("Namespace", "a.b"), ("Namespace", "a" * 64),
    ("Namespace", "Serving"), ("Namespace", "serving\n"), ("Namespace", ""), ("Namespace", "-x"),
    ("Deployment", "web\n- kind: Pod"), ("Deployment", "%2e%2e%2fx"), ("Deployment", "a\x00b"),
    ("Deployment", "a" * 254), ("Deployment", "x..y"), ("Deployment", "x\u202e"), ("CronJob", "a" * 53),
    ("Container", "a.b"), ("Pod", "x\x1b[2J"),
])
def test_names_kubernetes_refuses(kind: str, name: str) -> None:
    problem = k8s_name_problem(kind, name)
    assert problem is not None and not has_unsafe(problem)


@pytest.mark.parametrize("name", ["..", ".", "../x", "/etc/passwd", "a/b", "a\x00b", "x" * 256, "", "a\\b"])
def test_path_inside_refuses_what_leaves_the_directory(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        path_inside(tmp_path, name)


def test_path_inside_refuses_a_symbolic_link_out(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    inside = tmp_path / "in"
    inside.mkdir()
    (inside / "a.yaml").symlink_to(tmp_path / "out" / "a.yaml")
    with pytest.raises(ValueError, match="leads outside"):
        path_inside(inside, "a.yaml")
    assert path_inside(inside, "b.yaml") == inside / "b.yaml"


# -- patches ------------------------------------------------------------------------------------------------

INJECTION = "web\n# \napiVersion: v1\nkind: Pod\nmetadata: {name: x, namespace: kube-system}\nspec: {hostPID: true}"


@pytest.mark.parametrize(("key", "containers"), [
    (WorkloadKey("../../../../tmp/x/TRAVERSED", "Deployment", "web"), ("vllm",)),
    (WorkloadKey("/tmp/x", "Deployment", "web"), ("vllm",)),
    (WorkloadKey("serving", "Deployment", "../../escape"), ("vllm",)),
    (WorkloadKey("serving", "Deployment", "%2e%2e%2f%2e%2e%2fx"), ("vllm",)),
    (WorkloadKey("serving", "Deployment", "a\x00b"), ("vllm",)),
    (WorkloadKey("serving", "Deployment", "a" * 300), ("vllm",)),
    (WorkloadKey("serving", "Deployment", INJECTION), ("vllm",)),
    (WorkloadKey("serving", "StatefulSet", "db\x1b]0;pwned\x07"), ("vllm",)),
    (WorkloadKey("serving", "Deployment", "web"), ("vllm\n  securityContext: {privileged: true}",)),
])
def test_a_hostile_name_gets_no_patch_and_no_file(tmp_path: Path, key: WorkloadKey, containers: tuple[str, ...]
                                                 ) -> None:
    rec = MIG if "vllm\n" in containers[0] else SHARE
    row = row_of(rec, key, containers=containers)
    assert isinstance(patch_for(row), Refused)
    out = tmp_path / "patches"
    written, skipped = write_patches([row, row_of(SHARE)], out)
    assert [p.file_name for p in written] == ["serving.deployment.llm-api.yaml"]
    assert [type(why) for _, why in skipped] == [Refused]
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["patches", "kustomization.yaml", "serving.deployment.llm-api.yaml"])
    component = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert component["patches"] == [{"path": "serving.deployment.llm-api.yaml"}]


def test_refused_workloads_are_one_warning_and_each_listed(tmp_path: Path) -> None:
    from gpuagent.recommend.cli import patch_summary

    rows = [row_of(SHARE, WorkloadKey(f"../../x{i}\x1b[2J", "Deployment", "web")) for i in range(500)]
    written, skipped = write_patches([*rows, row_of(SHARE), row_of(Recommendation(Action.KEEP, "ok"))], tmp_path)
    lines = patch_summary(len(written), skipped, tmp_path)
    assert len(lines) == 2 + 500 and raw_controls("".join(lines)) == []
    assert lines[0].endswith("1 patch(es) in " + str(tmp_path) + "; none for 1 workload(s): "
                             "serving/Deployment/llm-api: nothing to set (keep)")
    assert "refused 500 workload(s)" in lines[1] and "../../x0\\x1b[2J" in lines[2] and "x499\\" in lines[-1]


def test_a_reason_with_newlines_stays_in_the_comment(tmp_path: Path) -> None:
    rec = dataclasses.replace(SHARE, reason=INJECTION + "\r\x85\u2028---\n" + INJECTION)
    patch = patch_for(row_of(rec, gpu_model=INJECTION))
    assert not isinstance(patch, str)
    documents = list(yaml.safe_load_all(patch.text))
    assert len(documents) == 1 and documents[0]["kind"] == "Deployment"
    assert all(line.startswith("# ") for line in patch.text.split("apiVersion: apps/v1")[0].splitlines())


def test_a_long_valid_name_gets_a_file_name_the_file_system_takes(tmp_path: Path) -> None:
    name = ".".join(["a" * 63] * 4)  # 255 characters: a valid subdomain, past NAME_MAX with the rest
    written, _ = write_patches([row_of(SHARE, WorkloadKey("serving", "Deployment", name[:253]))], tmp_path)
    (patch,) = written
    assert len(patch.file_name) <= 255 and (tmp_path / patch.file_name).is_file()
    assert yaml.safe_load(patch.text)["metadata"]["name"] == name[:253]


def test_one_workload_one_file_listed_once(tmp_path: Path) -> None:
    written, skipped = write_patches([row_of(SHARE), row_of(SHARE)], tmp_path)
    assert len(written) == 1 and len(skipped) == 1
    assert yaml.safe_load((tmp_path / "kustomization.yaml").read_text())["patches"] == [
        {"path": "serving.deployment.llm-api.yaml"}]


LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
SUBDOMAIN = st.lists(LABEL, min_size=1, max_size=4).map(".".join)


@FAST
@given(namespace=st.one_of(LABEL, HOSTILE), name=st.one_of(SUBDOMAIN, HOSTILE), container=st.one_of(LABEL, HOSTILE),
       reason=HOSTILE, model=HOSTILE)
def test_patches_stay_inside_and_read_back_as_intended(tmp_path_factory: pytest.TempPathFactory, namespace: str,
                                                       name: str, container: str, reason: str, model: str) -> None:
    base = tmp_path_factory.mktemp("case")
    out = base / "patches"
    rec = dataclasses.replace(MIG, reason=reason)
    row = row_of(rec, WorkloadKey(namespace, "Deployment", name), containers=(container,), gpu_model=model)
    written, skipped = write_patches([row], out)
    for path in base.rglob("*"):
        assert path == out or path.parent == out  # nothing anywhere else
    listed = [p["path"] for p in yaml.safe_load((out / "kustomization.yaml").read_text())["patches"]]
    assert listed == [p.file_name for p in written]
    if written:
        body = yaml.safe_load_all((out / written[0].file_name).read_text())
        assert list(body) == [{
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"spec": {"containers": [{"name": container, "resources": {
                "limits": {"nvidia.com/gpu": None, "nvidia.com/mig-2g.20gb": "1"},
                "requests": {"nvidia.com/gpu": None, "nvidia.com/mig-2g.20gb": "1"}}}]}}}}]
    else:
        assert isinstance(skipped[0][1], Refused)


@FAST
@given(st.dictionaries(st.sampled_from(["a", "why", "apply"]), HOSTILE, min_size=1))
def test_a_yaml_comment_is_only_comment(fields: dict[str, str]) -> None:
    text = yaml_comment(fields) + "x: 1\n"
    assert yaml.safe_load(text) == {"x": 1}
    assert not any(c in text for c in UNSAFE_CHARS if c != "\n")


# -- the terminal -------------------------------------------------------------------------------------------

ALL_ESCAPES = "".join(ESCAPES.values())


def test_snapshot_table_shows_escapes() -> None:
    snap = two_gpu_node()
    process = ProcessSample(99, ALL_ESCAPES, "compute", 4096, 1.0, 1.0)
    info = dataclasses.replace(snap.gpus[0].info, name="H100" + ESCAPES["csi clear screen"])
    gpu = dataclasses.replace(snap.gpus[0], info=info, processes=(process,), health_detail=ALL_ESCAPES)
    text = format_table(dataclasses.replace(snap, hostname="node\x1b]0;x\x07", gpus=(gpu,)))
    assert raw_controls(text) == [] and "\\x1b]0;pwned\\x07" in text


@FAST
@given(HOSTILE, HOSTILE)
def test_snapshot_table_never_carries_a_control(comm: str, hostname: str) -> None:
    snap = two_gpu_node()
    gpu = dataclasses.replace(snap.gpus[0], processes=(ProcessSample(99, comm, "compute", 4096, 1.0, 1.0),))
    assert raw_controls(format_table(dataclasses.replace(snap, hostname=hostname, gpus=(gpu,)))) == []


@FAST
@given(HOSTILE, HOSTILE, HOSTILE, HOSTILE)
def test_report_table_never_carries_a_control(namespace: str, pod: str, kind: str, workload: str) -> None:
    text = report_table(hostile_report(namespace, pod, kind, workload))
    assert raw_controls(text) == []
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("NAMESPACE  POD") or line.startswith("NAMESPACE"))
    assert len({len(line) for line in lines[header:header + 1]}) == 1


@FAST
@given(HOSTILE, HOSTILE, HOSTILE)
def test_recommend_table_never_carries_a_control(name: str, model: str, reason: str) -> None:
    rec = Recommendation(Action.KEEP, reason)
    row = row_of(rec, WorkloadKey(name, "Deployment", name), gpu_model=model)
    assert raw_controls(recommend_table(result([row]))) == []


def hostile_state(text: str) -> dict:
    """The tenant node's /v1/state with ``text`` added to every name the view shows."""
    names = {"hostname", "name", "comm", "namespace", "container", "pod", "model", "health_detail",
             "driver_version", "message", "cuda_driver_version", "backend"}

    def walk(value: object) -> object:
        if isinstance(value, dict):
            return {k: (v + text if k in names and isinstance(v, str) else walk(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(tenants_state())  # type: ignore[return-value]


def top_frame(state: dict, width: int = 160, message: str = "") -> str:
    options = ViewOptions(expanded=frozenset())
    node = node_view(state)
    options = dataclasses.replace(options, expanded=frozenset(r.key for r in arrange(node, options)))
    lines = [*render.header(node, AgentStatus(OK, message, 0.2), "http://x", options, width),
             *render.body(arrange(node, options), options, History(), width)]
    return render.plain(lines)


def test_top_shows_escapes_and_keeps_its_columns() -> None:
    text = top_frame(hostile_state(ALL_ESCAPES))
    assert raw_controls(text) == []
    assert "\\x1b]0;pwned\\x07" in text and "\\u202e" in text
    from rich.cells import cell_len

    assert max(cell_len(line) for line in text.splitlines()) <= 160  # measured on what is shown


def test_top_lines_hold_no_control_before_the_terminal() -> None:
    state = hostile_state(ESCAPES["csi clear screen"] + ESCAPES["bidi override"])
    node = node_view(state)
    options = ViewOptions()
    for line in render.body(arrange(node, options), options, History(), 160):
        assert raw_controls(line.text.plain) == []
    from rich.text import Text

    assert render.guarded(Text("a\x1b[2Jb")).plain == "a\\x1b[2Jb"


@FAST
@given(HOSTILE)
def test_top_frames_never_carry_a_control(text: str) -> None:
    assert raw_controls(top_frame(hostile_state(text), message=text)) == []


def test_a_log_record_with_an_outside_name_is_one_escaped_line() -> None:
    formatter = ShownFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "process %s exited", (INJECTION + ALL_ESCAPES,),
                               None)
    first, *rest = formatter.format(record).split("\n")
    assert first == "WARNING process web" and rest and all(line.startswith("  ") for line in rest)  # none forged
    assert raw_controls("".join(rest)) == [] and "\\x1b]0;pwned\\x07" in "".join(rest)
    try:
        raise ValueError("name\x1b]0;pwned\x07\nFORGED ERROR line")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    lines = formatter.format(record).split("\n")
    assert lines[0] == "ERROR failed" and all(line.startswith("  ") for line in lines[1:])
    assert raw_controls("".join(lines)) == []


# -- the exposition ------------------------------------------------------------------------------------------

COMMS = [b"\x1b]0;pwned\x07", b"\x1b[2J", b"a\rb", b"a\x00b", b"\x7f\x9b", b"\xff\xfe bad utf-8", b"\xe2\x80\xae rtl"]


def exposition_of(comm: str) -> tuple[str, str]:
    snap = two_gpu_node()
    gpu = dataclasses.replace(snap.gpus[0], processes=(ProcessSample(99, comm, "compute", 4096, 1.0, 1.0),))
    registry = build_registry(lambda: dataclasses.replace(snap, gpus=(gpu,)), clock=lambda: 0.0)
    return generate_text(registry).decode(), generate_openmetrics(registry).decode()


@pytest.mark.parametrize("raw", COMMS)
def test_a_hostile_comm_enters_the_snapshot_shown(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / "99").mkdir()
    (tmp_path / "99" / "comm").write_bytes(raw + b"\n")
    name = ProcessNames(tmp_path)(99)
    assert raw_controls(name) == [] and "\n" not in name
    text, openmetrics = exposition_of(name)
    for parse, exposition in ((parse_text, text), (parse_openmetrics, openmetrics)):
        comms = {s.labels.get("comm") for m in parse(exposition) for s in m.samples} - {None}
        assert name in comms and not any(has_unsafe(c) for c in comms)


@FAST
@given(st.binary(max_size=16).filter(lambda b: b"\n" not in b and b"/" not in b))
def test_any_comm_bytes_parse_back_without_controls(raw: bytes) -> None:
    name = ProcessNames("/nonexistent", fallback=lambda pid: raw.decode("utf-8", "surrogateescape"))(99)
    assert not has_unsafe(name)
    text, openmetrics = exposition_of(name or "x")
    for parse, exposition in ((parse_text, text), (parse_openmetrics, openmetrics)):
        comms = [s.labels["comm"] for m in parse(exposition) if m.name == "gpuagent_process_gpu_memory_used_bytes"
                 for s in m.samples]
        assert comms == [name or "x"]


@pytest.mark.parametrize("unit", ["evil\\x1b]0;pwned\\x07.service", "x\x1b[2J.scope", "rtl\u202e.service"])
def test_a_unit_name_from_a_cgroup_is_shown(unit: str) -> None:
    identity = parse_proc_cgroup(f"0::/system.slice/{unit}\n")
    workload = _workload(identity, None)
    assert not has_unsafe(workload.name) and workload.cgroup == f"/system.slice/{unit}"  # the path stays exact


# -- the selector --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("job", "selector", "matchers"), [
    (None, None, ('job=~"gpuagent"',)),
    (None, 'cluster="prod"', ('job=~"gpuagent"', 'cluster="prod"')),
    (None, 'job="monitoring/gpuagent"', ('job="monitoring/gpuagent"',)),
    (None, 'cluster="a", job=~".*gpuagent.*"', ('cluster="a", job=~".*gpuagent.*"',)),
    ("gpu-agents", None, ('job=~"gpu-agents"',)),
    ('a"b', None, ('job=~"a\\"b"',)),
    ("", None, ()),
])
def test_report_and_recommend_read_the_agents_job(job: str | None, selector: str | None,
                                                  matchers: tuple[str, ...]) -> None:
    assert job_matchers(job, selector) == matchers


def test_the_default_names_what_the_shipped_manifests_scrape() -> None:
    root = Path(__file__).resolve().parents[1]
    monitor = yaml.safe_load((root / "deploy" / "servicemonitor.yaml").read_text())
    service = yaml.safe_load((root / "deploy" / "service.yaml").read_text())
    # a ServiceMonitor's job is its Service's name (no jobLabel set)
    assert "jobLabel" not in monitor["spec"] and service["metadata"]["name"] == "gpuagent"
    assert job_matchers(None, None) == (f'job=~"{service["metadata"]["name"]}"',)


@pytest.mark.parametrize("command", ["report", "recommend"])
def test_the_job_option_is_in_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuagent.cli import main

    assert main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--job REGEX" in out and "(default gpuagent, as deploy/servicemonitor.yaml names it" in out
