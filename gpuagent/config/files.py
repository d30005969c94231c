"""Bounded, strict reading of the YAML files the agent is given: its config file, a web config, a token file.
``read_regular_file`` reads at most a few megabytes of a regular file (never a FIFO, a device or a
directory); ``read_yaml_mapping`` parses it as a YAML mapping with a loader that refuses a key given twice.
Every problem is a ``ConfigError`` whose source is the path, worded without the file's content: the path
may be any file the caller can read, and the message goes to logs and terminals. These readers are shared
by the config loader and by other readers of operator files (TLS, the extender's options, ``gpuagent top``'s
cluster file, the simulator's scenarios), which is why they are a module of their own.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

import yaml

from gpuagent.config.errors import ConfigError
from gpuagent.untrusted import shown

MAX_FILE_BYTES = 4 << 20  # a config, web config or agents file: a long policies list is some kilobytes


def read_regular_file(path: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes``; a ``ConfigError`` (source ``path``)
    for anything else. Opened without blocking (a FIFO would wait for a writer for ever) and checked on the
    descriptor: a device (``/dev/zero`` reads without end), a FIFO, a socket or a directory is refused by
    kind, and a file longer than the bound is refused without reading the rest."""
    cannot = "cannot read the config file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError("", f"{cannot}: {err.strerror or err}", path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError("", f"{cannot}: expected a regular file, got {_file_kind(mode)}", path)
        with os.fdopen(os.dup(fd), "rb") as stream:
            data = stream.read(max_bytes + 1)
    except OSError as err:
        raise ConfigError("", f"{cannot}: {err.strerror or err}", path) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ConfigError("", f"{cannot}: expected at most {max_bytes} bytes, it holds more", path)
    return data


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((word for test, word in kinds if test(mode)), "not a regular file")


# A key as a config key is written: a name (and dots, dashes). Only such a key is named in an error; any
# other "key" is a line of some other file (``root:*:20228:...:`` of a shadow file read as a web config).
_KEY_SHAPE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def key_text(key: Any) -> str:
    """A key read from a file, as an error message may name it: itself when it has the shape of a config
    key (a typo to correct), else only its length: the file may be any file the caller can read, and the
    message goes to terminals and logs."""
    if isinstance(key, str) and _KEY_SHAPE.fullmatch(key):
        return key
    if isinstance(key, bool | int | float) or key is None:
        return repr(key)
    return f"(a key of {len(str(key))} characters, not a config key)"


def _quoted_parts_hidden(problem: str) -> str:
    """PyYAML's words for a syntax problem, each quoted part of the file (an alias, a tag, a duplicate key)
    kept only where it is a single character or has a config key's shape."""
    def one(match: re.Match[str]) -> str:
        inner = match.group()[1:-1]
        return match.group() if len(inner) <= 2 or _KEY_SHAPE.fullmatch(inner) else "'...'"

    return re.sub(r"'[^']*'|\"[^\"]*\"", one, problem)


def read_yaml_mapping(path: str) -> dict[Any, Any]:
    """A YAML file that must hold a mapping, read strictly (a key given twice is an error); every problem
    is a ``ConfigError`` whose source is ``path``. A file that is not such a mapping is named with what kind
    of problem it has and where, never with its content: the path may be any file the caller can read
    (``/etc/passwd`` as a ``web_config``), and the message goes to logs and terminals. What is read is
    bounded (:func:`read_regular_file`)."""
    try:
        text = read_regular_file(path).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError("", f"not UTF-8 text (byte {err.start})", path) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = shown(_quoted_parts_hidden(str(err.problem or err.context or "a syntax error")))
        raise ConfigError("", f"invalid YAML{where}: {problem[:100]}", path) from None
    except yaml.reader.ReaderError as err:  # a character YAML does not allow (a control, say)
        char = err.character if isinstance(err.character, int) else -1
        raise ConfigError("", f"invalid YAML at character {err.position + 1}: character #x{char:04x} is not "
                              f"allowed", path) from None
    except yaml.YAMLError as err:
        raise ConfigError("", f"invalid YAML: {type(err).__name__}", path) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"expected a mapping of keys to values, got {_kind_of(data)}", path)
    return data


def _kind_of(value: Any) -> str:
    """What kind of YAML value ``value`` is, without any of its content."""
    if isinstance(value, list):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, str):
        return f"a string of {len(value)} character(s) (not YAML keys and values)"
    return "a boolean" if isinstance(value, bool) else "a number" if isinstance(value, int | float) else (
        f"a {type(value).__name__}")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: list[Any] = []
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<" merges may be overridden by the mapping's own keys
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.append(key)
        return super().construct_mapping(node, deep=deep)
