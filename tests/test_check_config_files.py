"""``check-config`` and ``run`` never echo a file and bound what they read (issue 28, item 9).

A config key names a file (``web_config``) that may be any file the agent can read: the system's shadow
file made ``check-config`` print its first line (``root:*:20228:...: unknown key``), a shadow-like file a
whole ``$6$`` hash; ``check-config /dev/zero`` read without end. The errors name the key and what was
expected, never the file's content; a device, a FIFO or a directory is refused by kind, a long file by size.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuagent import cli
from gpuagent.api.tls import load_web_config
from gpuagent.config import ConfigError, key_text, read_regular_file, read_yaml_mapping

HASH = "$6$rounds=5000$saltsalt$Qh0v3ryS3cr3tHashThatMustNeverBePrinted0123456789abcdefghijklmnopq"
SHADOW = f"root:*:20228:0:99999:7:::\nalice:{HASH}:20228:0:99999:7:::\n"


def secret_parts(text: str) -> list[str]:
    return [part for part in ("root:*", "20228", "alice", "$6$", "S3cr3t") if part in text]


@pytest.fixture
def shadow(tmp_path: Path) -> Path:
    path = tmp_path / "shadow"
    path.write_text(SHADOW)
    return path


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_a_web_config_naming_a_shadow_file_is_refused_without_a_word_of_it(
        command: str, shadow: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("GPUAGENT_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "config.yaml"
    config.write_text(f"web_config: {shadow}\nbackend: sim\n")
    args = ["check-config", str(config)] if command == "check-config" else ["run", "--config", str(config)]
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    assert secret_parts(out + err) == []
    assert f"{shadow}: (a key of 24 characters, not a config key): unknown key" in err


def test_the_config_file_itself_is_never_echoed(shadow: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config", str(shadow)]) == 2
    err = capsys.readouterr().err
    assert secret_parts(err) == [] and "not a config key): unknown key" in err


def test_a_typo_in_a_config_key_is_still_named() -> None:
    assert key_text("poll_intervall") == "poll_intervall"
    assert key_text(3) == "3"
    assert key_text("alice:" + HASH) == f"(a key of {6 + len(HASH)} characters, not a config key)"
    assert key_text("x\x1b[2J") == "(a key of 5 characters, not a config key)"


def test_a_web_config_key_inside_tls_server_config_is_named_only_by_shape(tmp_path: Path) -> None:
    path = tmp_path / "web.yaml"
    path.write_text(f"tls_server_config:\n  '{HASH}': 1\n")
    with pytest.raises(ConfigError) as caught:
        load_web_config(str(path))
    assert "$6$" not in str(caught.value) and "tls_server_config.(a key of" in str(caught.value)


@pytest.mark.parametrize("text", [
    f"root: 1\n'alice:{HASH}': 1\n'alice:{HASH}': 2\n",  # a duplicate key: PyYAML's words quote it
    f"a: !<tag:{HASH}> 1\n",  # a tag nothing constructs: quoted too
    f"a: *{HASH[3:20]}\n",  # an alias never defined
])
def test_yaml_syntax_errors_quote_nothing_of_the_file(text: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_yaml_mapping(str(path))
    message = str(caught.value)
    assert "invalid YAML at line" in message and "S3cr3t" not in message and "saltsalt" not in message


def test_a_fifo_is_refused_at_once_never_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result: list[BaseException] = []
    reader = threading.Thread(target=lambda: result.append(_error_of(str(fifo))), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # the old reader blocked in open() until a writer came: be that writer
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail("opening a FIFO waited for a writer")
    assert "expected a regular file, got a FIFO" in str(result[0])


def _error_of(path: str) -> BaseException:
    try:
        read_yaml_mapping(path)
    except ConfigError as err:
        return err
    raise AssertionError("no error")


def test_a_directory_and_a_long_file_are_refused_by_kind_and_size(tmp_path: Path) -> None:
    assert "expected a regular file, got a directory" in str(_error_of(str(tmp_path)))
    long = tmp_path / "long.yaml"
    long.write_bytes(b"a: " + b"x" * 100)
    with pytest.raises(ConfigError, match="expected at most 64 bytes, it holds more"):
        read_regular_file(str(long), max_bytes=64)
    assert read_regular_file(str(long), max_bytes=103) == b"a: " + b"x" * 100


def test_check_config_on_dev_zero_is_refused_in_bounded_memory() -> None:
    """In a child under a 1 GiB address-space limit: the old reader grew to gigabytes within seconds."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "from gpuagent import cli; sys.exit(cli.main(['check-config', '/dev/zero']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", "")})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("/dev/zero: cannot read the config file: expected a regular file, "
                                   "got a character device")


@pytest.mark.parametrize("content", [SHADOW, "root:x:0:0:root:/root:/bin/bash\n"])
def test_a_scenario_naming_a_system_file_is_refused_without_a_word_of_it(
        content: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The scenario loader named an unknown top-level key, or a top level that is no mapping, by its text:
    ``scenario: /etc/passwd`` printed its first line."""
    target = tmp_path / "system-file"
    target.write_text(content)
    config = tmp_path / "config.yaml"
    config.write_text(f"scenario: {target}\nbackend: sim\n")
    assert cli.main(["check-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert secret_parts(err) == [] and "/bin/bash" not in err and "scenario:" in err


def test_a_scenario_is_read_from_a_regular_file_only(tmp_path: Path) -> None:
    from gpuagent.devices.sim import ScenarioError, load_scenario

    with pytest.raises(ScenarioError, match="expected a regular file, got a directory"):
        load_scenario(tmp_path)  # a device or a FIFO the same way (read_regular_file, tested above)


def test_the_extenders_config_file_is_not_echoed_either(shadow: Path) -> None:
    from gpuagent.hints.extender_config import load_options

    with pytest.raises(ConfigError) as caught:
        load_options(str(shadow), env={})
    assert secret_parts(str(caught.value)) == [] and "not a config key): unknown key" in str(caught.value)
