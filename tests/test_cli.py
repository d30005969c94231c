"""gpuagent.cli: check-config exit codes and messages, flag/env precedence, and the snapshot table."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from gpuagent import cli
from gpuagent.cli_table import format_table
from gpuagent.config import KEYS, Config
from gpuagent.snapshot.gpu import GpuInfo, GpuSample, Health, MigSample, ProfilingSample
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.processes import ProcessSample

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
MIB = 1024**2


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GPUAGENT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NODE_NAME", "test-node")


pytestmark = pytest.mark.usefixtures("restore_logging")  # the CLI sets up the root logger


@pytest.fixture
def fake_agent(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A stand-in ``gpuagent.agent`` recording the Config it is given."""
    calls = types.SimpleNamespace(run=[], poll_once=[], snapshot=sample_snapshot())
    module = types.ModuleType("gpuagent.agent")

    def run(config: Config) -> int:
        calls.run.append(config)
        return 0

    def poll_once(config: Config) -> NodeSnapshot:
        calls.poll_once.append(config)
        return calls.snapshot

    module.run = run  # type: ignore[attr-defined]
    module.poll_once = poll_once  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpuagent.agent", module)
    return calls


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- check-config -------------------------------------------------------------------------------------------


def test_check_config_ok_prints_the_effective_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, "poll_interval: 0.5\nbackend: sim\n")
    assert cli.main(["check-config", path]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"ok: {path}"
    for key in KEYS:
        assert f"\n{key.name}: " in out
    assert "poll_interval: 0.5" in out
    assert "hostname: 'test-node'" in out


def test_check_config_of_an_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["check-config", write(tmp_path, "")]) == 0
    assert "listen: '0.0.0.0:9402'" in capsys.readouterr().out


BAD_FILES = [
    pytest.param("poll_interval: fast\n", "poll_interval: expected a number", id="wrong-type"),
    pytest.param("poll_interval: true\n", "poll_interval: expected a number", id="bool-is-not-a-number"),
    pytest.param(
        "poll_interval: 301\n", "poll_interval: expected a number > 0 and <= 300", id="out-of-range"
    ),
    pytest.param("nvml_timeout: -1\n", "nvml_timeout: expected a number > 0, got -1", id="negative-timeout"),
    pytest.param("poll_interval: 5\nslow_poll_interval: 1\n", "slow_poll_interval: ", id="slow-below-poll"),
    pytest.param(
        "poll_intervall: 1\n", "poll_intervall: unknown key; did you mean 'poll_interval'", id="unknown"
    ),
    pytest.param("listen: '0.0.0.0:99999'\n", "listen: expected HOST:PORT", id="bad-port"),
    pytest.param("listen: '::1:9402'\n", "listen: expected HOST:PORT", id="ipv6-no-brackets"),
    pytest.param("backend: cuda\n", "backend: expected one of auto, nvml, sim, got 'cuda'", id="bad-backend"),
    pytest.param("log_level: loud\n", "log_level: expected one of debug", id="bad-log-level"),
    pytest.param(
        "scenario: nowhere.yaml\n", "scenario: expected a path to an existing", id="missing-scenario"
    ),
    pytest.param("poll_interval: [1\n", "invalid YAML at line 2", id="yaml-syntax"),
    pytest.param("- a\n- b\n", "expected a mapping", id="not-a-mapping"),
    pytest.param("listen: 'a:1'\nlisten: 'b:2'\n", "duplicate key 'listen'", id="duplicate-key"),
    # pod_annotations (docs/isolation.md: what pods' annotations may do)
    ("pod_annotations: all\n", "pod_annotations: expected one of ignore, lower-only, any"),
    ("pod_annotations: [any]\n", "pod_annotations: expected one of ignore, lower-only, any"),
    ("policies:\n  - {match_namespace: a, pod_annotations: lower}\n",
     "policies[0].pod_annotations: expected one of ignore, lower-only, any, got 'lower'; did you mean lower-only?"),
    ("policies:\n  - {match_namespace: a, pod_anotations: any}\n",
     "policies[0].pod_anotations: unknown key; did you mean pod_annotations?"),
    # the latency class (docs/isolation.md)
    ("policies:\n  - {match_namespace: a, latency_sensitive: often}\n",
     "policies[0].latency_sensitive: expected true or false (also yes/no, 1/0), got 'often'"),
    ("policies:\n  - {match_namespace: a, latency_sensitve: true}\n",
     "policies[0].latency_sensitve: unknown key; did you mean latency_sensitive?"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_FILES)
def test_check_config_bad_file_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str, fragment: str
) -> None:
    path = write(tmp_path, text)
    assert cli.main(["check-config", path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"{path}: ")
    assert fragment in captured.err
    assert len(captured.err.splitlines()) == 1


def test_check_config_nvml_with_scenario_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    scenario = write(tmp_path, "gpus: []\n", "s.yaml")
    path = write(tmp_path, f"backend: nvml\nscenario: {scenario}\n")
    assert cli.main(["check-config", path]) == 2
    assert "scenario: a scenario drives the simulator, but backend is 'nvml'" in capsys.readouterr().err


def test_check_config_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["check-config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read the config file" in capsys.readouterr().err


def test_check_config_applies_env_over_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "poll_interval: 2\n")
    monkeypatch.setenv("GPUAGENT_POLL_INTERVAL", "0.25")
    assert cli.main(["check-config", path]) == 0
    assert "poll_interval: 0.25" in capsys.readouterr().out


def test_check_config_bad_env_names_the_env_var(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUAGENT_POLL_INTERVAL", "fast")
    assert cli.main(["check-config", write(tmp_path, "")]) == 2
    assert capsys.readouterr().err.strip() == (
        "env GPUAGENT_POLL_INTERVAL: expected a number > 0 and <= 300, got 'fast'"
    )


def _python_m_gpuagent(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUAGENT_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "gpuagent", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.integration
def test_check_config_in_a_real_process(tmp_path: Path) -> None:
    write(tmp_path, "poll_interval: true\n", "bad.yaml")
    bad = _python_m_gpuagent("check-config", "bad.yaml", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr == "bad.yaml: poll_interval: expected a number > 0 and <= 300, got true\n"

    write(tmp_path, "backend: sim\n", "good.yaml")
    good = _python_m_gpuagent("check-config", "good.yaml", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith("ok: good.yaml\n")


# What run refuses at start, check-config refuses with the same line: (config text, extra files, the error).
START_FAILURES = {
    "a bad policy, enforcement off": (
        "policies: [{match_namespace: a, gpu_share: 150}]\n", {},
        "{dir}/config.yaml: policies[0].gpu_share: expected a percent in (0, 100] like 30 or 30%, got '150'",
    ),
    "an unknown policy key": (
        "mode: audit\npolicies: [{namespace: a, gpu_share: 50}]\n", {},
        "{dir}/config.yaml: policies[0].namespace: unknown key; did you mean match_namespace?",
    ),
    "an ambiguous default share": (
        "default_gpu_share: 0.5\n", {},
        "{dir}/config.yaml: default_gpu_share: ambiguous share '0.5'",
    ),
    "a scenario that fails its schema": (
        "backend: sim\nscenario: s.yaml\n", {"s.yaml": "gpus: 3\n"},
        "{dir}/config.yaml: scenario: {dir}/s.yaml: gpus: expected a list, got 3",
    ),
    "an empty admin token file": (
        "admin_token_file: token\n", {"token": " \n"},
        "{dir}/config.yaml: admin_token_file: {dir}/token is empty: no admin request could authenticate",
    ),
}


@pytest.mark.parametrize("case", list(START_FAILURES))
def test_check_config_refuses_what_run_refuses_with_the_same_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture, fake_agent: types.SimpleNamespace
) -> None:
    text, files, error = START_FAILURES[case]
    for name, content in files.items():
        write(tmp_path, content, name)
    path = write(tmp_path, text)
    expected = error.format(dir=tmp_path)
    assert cli.main(["check-config", path]) == 2
    checked = capsys.readouterr()
    assert checked.out == ""
    assert checked.err.startswith(expected) and checked.err.count("\n") == 1, checked.err
    assert cli.main(["run", "--config", path]) == 2
    assert capsys.readouterr().err == checked.err
    assert fake_agent.run == []  # refused before anything started


def test_check_config_passes_what_run_starts_with(
    tmp_path: Path, capsys: pytest.CaptureFixture, fake_agent: types.SimpleNamespace
) -> None:
    write(tmp_path, "gpus: [{model: L4}]\n", "s.yaml")
    write(tmp_path, "s3cret\n", "token")
    path = write(tmp_path, "backend: sim\nscenario: s.yaml\nadmin_token_file: token\nmode: audit\n"
                           "default_gpu_share: 50\npolicies: [{match_namespace: a, gpu_share: 30%}]\n")
    assert cli.main(["check-config", path]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"ok: {path}\n")
    assert cli.main(["run", "--config", path]) == 0
    assert len(fake_agent.run) == 1


def test_the_documented_policies_example_passes_and_names_every_key(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """docs/configuration.md's policy schema: its example is a config check-config passes, and its tables
    name exactly the selectors and limits the parser knows."""
    from gpuagent.enforce import rules

    doc = (REPO / "docs" / "configuration.md").read_text()
    section = doc[doc.index("## `policies`"):]
    (example,) = re.findall(r"^```yaml\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert cli.main(["check-config", write(tmp_path, example)]) == 0, capsys.readouterr().err
    tabled = re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE)
    assert tabled == [*rules._MATCH_KEYS, *rules._LIMIT_KEYS]


@pytest.mark.integration
@pytest.mark.parametrize("command", ["snapshot", "hints", "run"])
def test_a_bad_scenario_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    write(tmp_path, "gpus: 3\n", "bad.yaml")
    result = _python_m_gpuagent(command, "--backend", "sim", "--scenario", "bad.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == "flag --scenario: bad.yaml: gpus: expected a list, got 3\n"
    assert result.stdout == ""


LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ", re.MULTILINE)  # cli.LOG_FORMAT


@pytest.mark.integration
@pytest.mark.parametrize("command", ["snapshot", "hints"])
def test_one_shot_commands_print_their_table_without_log_lines(command: str, tmp_path: Path) -> None:
    """The table on stdout, and no INFO line on stderr either (a terminal shows both, interleaved); a
    log_level given explicitly still logs."""
    result = _python_m_gpuagent(command, "--backend", "sim", "--format", "table", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # nothing but the line saying it ran without pod sources (tests/test_cli_pod_sources.py)
    assert [line for line in result.stderr.splitlines() if " no pod sources: " not in line] == []
    assert result.stdout.strip() and not LOG_RECORD.search(result.stdout)
    write(tmp_path, "log_level: info\n")
    verbose = _python_m_gpuagent(command, "--backend", "sim", "--config", "config.yaml", "--format", "table",
                                 cwd=tmp_path)
    assert " INFO gpuagent.devices.poller: NVML initialised" in verbose.stderr
    assert not LOG_RECORD.search(verbose.stdout)


@pytest.mark.integration
def test_check_config_does_not_import_the_agent(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    code = (
        "import sys; from gpuagent import cli; rc = cli.main(['check-config', sys.argv[1]]); "
        "heavy = [m for m in ('gpuagent.agent', 'gpuagent.devices', 'aiohttp', 'pynvml') "
        "if m in sys.modules]; "
        "print(heavy, file=sys.stderr); sys.exit(rc or (3 if heavy else 0))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, path],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


# --- usage --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [[], ["frobnicate"], ["run", "--bogus"], ["check-config"], ["snapshot", "--format", "xml"]],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert cli.main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_help_exits_0_and_lists_every_key(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--help"]) == 0
    top = capsys.readouterr().out
    assert cli.main(["run", "--help"]) == 0
    run_help = capsys.readouterr().out
    for key in KEYS:
        assert key.env in top
        assert key.flag in run_help
    assert "9402" in run_help


def test_contract_flags_exist() -> None:
    parser = cli.build_parser()
    run = parser.parse_args(
        [
            "run",
            "--config",
            "f",
            "--backend",
            "sim",
            "--scenario",
            "s",
            "--listen",
            "h:1",
            "--poll-interval",
            "2",
        ]
    )
    assert (run.config, run.backend, run.scenario, run.listen, run.poll_interval) == (
        "f",
        "sim",
        "s",
        "h:1",
        "2",
    )
    snap = parser.parse_args(["snapshot", "--backend", "sim", "--scenario", "s", "--format", "table"])
    assert (snap.backend, snap.scenario, snap.format) == ("sim", "s", "table")


# --- run and snapshot (against a fake gpuagent.agent) -------------------------------------------------------


def test_run_passes_flags_over_env_over_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_agent: types.SimpleNamespace
) -> None:
    path = write(tmp_path, "poll_interval: 2\nlisten: '127.0.0.1:9000'\nxid_window: 60\n")
    monkeypatch.setenv("GPUAGENT_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("GPUAGENT_LISTEN", "127.0.0.1:9001")
    assert cli.main(["run", "--config", path, "--listen", "127.0.0.1:9002", "--backend", "sim"]) == 0
    (config,) = fake_agent.run
    assert config.server.listen == "127.0.0.1:9002"  # flag over env
    assert config.devices.poll_interval == 0.5  # env over file
    assert config.devices.xid_window == 60.0  # file over default
    assert config.devices.backend == "sim"
    assert config.agent.hostname == "test-node"


def test_run_config_file_from_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_agent: types.SimpleNamespace
) -> None:
    monkeypatch.setenv("GPUAGENT_CONFIG", write(tmp_path, "poll_interval: 4\n"))
    assert cli.main(["run"]) == 0
    assert fake_agent.run[0].devices.poll_interval == 4.0


def test_run_returns_the_agents_status(
    monkeypatch: pytest.MonkeyPatch, fake_agent: types.SimpleNamespace
) -> None:
    monkeypatch.setattr(sys.modules["gpuagent.agent"], "run", lambda config: 3)
    assert cli.main(["run"]) == 3


def test_run_bad_flag_value_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture, fake_agent: types.SimpleNamespace
) -> None:
    assert cli.main(["run", "--poll-interval", "0"]) == 2
    assert (
        capsys.readouterr().err.strip() == "flag --poll-interval: expected a number > 0 and <= 300, got '0'"
    )
    assert fake_agent.run == []


def test_run_bad_env_exits_2(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, fake_agent: types.SimpleNamespace
) -> None:
    monkeypatch.setenv("GPUAGENT_BACKEND", "cuda")
    assert cli.main(["run"]) == 2
    assert capsys.readouterr().err.startswith("env GPUAGENT_BACKEND: expected one of auto, nvml, sim")


def test_run_bad_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, fake_agent: types.SimpleNamespace
) -> None:
    path = write(tmp_path, "backend: nvml\n")
    scenario = write(tmp_path, "gpus: []\n", "s.yaml")
    assert cli.main(["run", "--config", path, "--scenario", scenario]) == 2
    assert capsys.readouterr().err.startswith("flag --scenario: a scenario drives the simulator")


def test_run_sets_up_one_line_logging(fake_agent: types.SimpleNamespace) -> None:
    assert cli.main(["run", "--log-level", "debug"]) == 0
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, "_gpuagent", False)]
    assert len(ours) == 1
    assert ours[0].formatter is not None and ours[0].formatter._fmt == cli.LOG_FORMAT
    assert root.level == logging.DEBUG
    assert cli.main(["run", "--log-level", "warning"]) == 0  # again: replaced, not added
    assert len([h for h in root.handlers if getattr(h, "_gpuagent", False)]) == 1
    assert root.level == logging.WARNING


def test_snapshot_prints_json(capsys: pytest.CaptureFixture, fake_agent: types.SimpleNamespace) -> None:
    assert cli.main(["snapshot", "--backend", "sim"]) == 0
    (config,) = fake_agent.poll_once
    assert config.devices.backend == "sim"
    data = json.loads(capsys.readouterr().out)
    assert data["hostname"] == "node-a"
    assert data["gpus"][0]["health"] == "ok"
    assert data["gpus"][0]["info"]["name"] == "NVIDIA H100 80GB HBM3"


def test_snapshot_prints_a_table(capsys: pytest.CaptureFixture, fake_agent: types.SimpleNamespace) -> None:
    assert cli.main(["snapshot", "--format", "table"]) == 0
    assert capsys.readouterr().out == format_table(fake_agent.snapshot)


def test_snapshot_config_error_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, fake_agent: types.SimpleNamespace
) -> None:
    assert cli.main(["snapshot", "--scenario", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err.startswith("flag --scenario: expected a path to an existing scenario file")
    assert fake_agent.poll_once == []


# --- the table ----------------------------------------------------------------------------------------------


def info(index: int, name: str = "NVIDIA H100 80GB HBM3", *, mig: bool = False) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index:08d}",
        name=name,
        serial=None,
        pci_bus_id=f"00000000:{index + 1:02X}:00.0",
        minor_number=index,
        memory_total_bytes=80 * GIB,
        power_limit_watts=700.0,
        mig_enabled=mig,
    )


def proc(pid: int, comm: str, mib: int | None, sm: float | None, gi: int | None = None) -> ProcessSample:
    return ProcessSample(
        pid=pid,
        comm=comm,
        kind="compute",
        used_memory_bytes=None if mib is None else mib * MIB,
        sm_util_percent=sm,
        memory_util_percent=None,
        gpu_instance_id=gi,
    )


def sample_snapshot() -> NodeSnapshot:
    train = proc(4242, "python", 20480, 87.0)
    infer_a = proc(5001, "tritonserver", 9000, None, gi=1)
    infer_b = proc(5002, "vllm", 30000, None, gi=2)
    gpus = (
        GpuSample(
            info=info(0),
            sampled_at_unix=1_700_000_000.0,
            gpu_util_percent=87.0,
            memory_used_bytes=20 * GIB,
            temperature_celsius=64.0,
            power_watts=512.4,
            processes=(train,),
        ),
        GpuSample(
            info=info(1, "NVIDIA A100-SXM4-80GB", mig=True),
            sampled_at_unix=1_700_000_000.0,
            gpu_util_percent=None,  # MIG: no whole-GPU utilization
            memory_used_bytes=38 * GIB,
            temperature_celsius=41.0,
            power_watts=None,
            processes=(infer_a, infer_b),
            migs=(
                MigSample(
                    gpu_instance_id=1,
                    compute_instance_id=0,
                    uuid="MIG-1",
                    profile="3g.40gb",
                    slice_fraction=3 / 7,
                    memory_total_bytes=40 * GIB,
                    memory_used_bytes=9 * GIB,
                    memory_free_bytes=31 * GIB,
                    processes=(infer_a,),
                    profiling=ProfilingSample(graphics_active_ratio=0.5),
                ),
                MigSample(
                    gpu_instance_id=2,
                    compute_instance_id=0,
                    uuid="MIG-2",
                    profile="3g.40gb",
                    slice_fraction=3 / 7,
                    memory_total_bytes=40 * GIB,
                    memory_used_bytes=29 * GIB,
                    memory_free_bytes=11 * GIB,
                    processes=(infer_b,),
                ),
            ),
        ),
        GpuSample(
            info=info(2),
            sampled_at_unix=1_700_000_000.0,
            health=Health.LOST,
            health_detail="fell off the bus",
            stale=True,
        ),
    )
    return NodeSnapshot(
        hostname="node-a",
        backend="sim",
        taken_at_unix=1_700_000_000.0,
        taken_at_monotonic=100.0,
        poll_duration_seconds=0.012,
        driver_version="550.54.15",
        gpus=gpus,
    )


def test_table_golden() -> None:
    assert format_table(sample_snapshot()) == (
        "host node-a  backend sim  driver 550.54.15  taken 2023-11-14T22:13:20Z  poll 12 ms  STALE\n"
        "\n"
        "GPU  NAME                     UTIL %    MEM GiB  TEMP C  POWER W  HEALTH        PROCS\n"
        "0    NVIDIA H100 80GB HBM3        87  20.0/80.0      64      512  ok                1\n"
        "1    NVIDIA A100-SXM4-80GB         -  38.0/80.0      41        -  ok                2\n"
        "       MIG 3g.40gb GI 1 CI 0      50   9.0/40.0                                     1\n"
        "       MIG 3g.40gb GI 2 CI 0       -  29.0/40.0                                     1\n"
        "2    NVIDIA H100 80GB HBM3         -     -/80.0       -        -  lost (stale)      0\n"
        "GPU 2 lost (stale): fell off the bus\n"
        "\n"
        "GPU     PID  COMM          MEM MiB  SM %\n"
        "0      4242  python          20480    87\n"
        "1/gi1  5001  tritonserver     9000     -\n"
        "1/gi2  5002  vllm            30000     -\n"
    )


def test_table_lists_a_mig_process_once_even_when_only_the_instance_has_it() -> None:
    snap = sample_snapshot()
    gpu = snap.gpus[1]
    migs = tuple(dataclasses.replace(m, processes=(proc(7, "x", 1, None),)) for m in gpu.migs)
    only_in_migs = GpuSample(info=gpu.info, sampled_at_unix=0.0, migs=migs)
    text = format_table(NodeSnapshot("n", "sim", 0.0, 0.0, 0.0, gpus=(only_in_migs,)))
    rows = [line.split() for line in text.splitlines()[-2:]]
    assert rows == [["1/gi1", "7", "x", "1", "-"], ["1/gi2", "7", "x", "1", "-"]]  # one per instance


def test_table_never_prints_unknown_as_zero() -> None:
    bare = GpuSample(info=dataclasses.replace(info(0), memory_total_bytes=None), sampled_at_unix=0.0)
    text = format_table(NodeSnapshot("n", "nvml", 0.0, 0.0, 0.0, gpus=(bare,)))
    row = text.splitlines()[3]
    assert row.split() == ["0", "NVIDIA", "H100", "80GB", "HBM3", "-", "-/-", "-", "-", "ok", "0"]
    assert text.endswith("no processes\n")


def test_table_without_gpus() -> None:
    text = format_table(NodeSnapshot("n", "nvml", 0.0, 0.0, 0.0, driver_version=None))
    assert text == "host n  backend nvml  driver -  taken 1970-01-01T00:00:00Z  poll 0 ms\n\nno GPUs\n"


def test_table_process_without_comm_or_memory() -> None:
    gpu = GpuSample(info=info(3), sampled_at_unix=0.0, processes=(proc(99, "", None, 5.0),))
    text = format_table(NodeSnapshot("n", "nvml", 0.0, 0.0, 0.0, gpus=(gpu,)))
    assert text.splitlines()[-1].split() == ["3", "99", "-", "-", "5"]


@pytest.mark.parametrize("command", ["snapshot", "hints"])
def test_output_piped_into_a_reader_that_stops_early_is_not_an_error(command: str) -> None:
    """``gpuagent snapshot | head -c0``: the reader is gone before the command writes (it polls first), so the
    write fails with EPIPE; the command still exits 0 and prints no traceback (a BrokenPipeError, on the
    write or on the interpreter's final flush)."""
    agent = subprocess.Popen([sys.executable, "-m", "gpuagent", command, "--backend", "sim", "--format", "json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert agent.stdout is not None and agent.stderr is not None
    agent.stdout.close()  # the only reader: the pipe has none left
    errors = agent.stderr.read().decode()
    assert agent.wait(timeout=120) == 0, errors
    assert "Traceback" not in errors and "BrokenPipe" not in errors, errors


def test_the_http_clients_request_lines_show_at_debug_only(capsys: pytest.CaptureFixture[str]) -> None:
    """An agent with a watch, the publisher and the health writer logged a line per request at INFO."""
    from gpuagent.cli import setup_logging

    client = logging.getLogger("httpx2")
    before = client.level
    root_level = logging.getLogger().level
    try:
        setup_logging("info")
        client.info("HTTP Request: GET https://api/apis 200 OK")
        client.warning("the API server closed the connection")
        logging.getLogger("gpuagent.test").info("the agent's own line")
        err = capsys.readouterr().err
        assert "HTTP Request" not in err and "closed the connection" in err and "the agent's own line" in err
        setup_logging("debug")
        client.info("HTTP Request: GET https://api/apis 200 OK")
        assert "HTTP Request" in capsys.readouterr().err
    finally:
        client.setLevel(before)
        logging.getLogger().setLevel(root_level)
        for handler in logging.getLogger().handlers[:]:
            if getattr(handler, "_gpuagent", False):
                logging.getLogger().removeHandler(handler)
