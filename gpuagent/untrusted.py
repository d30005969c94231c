"""Strings from outside, made safe for where they go: the one place that knows each sink's rule.

Process names and command lines, cgroup-derived names, pod, namespace, container and owner names, label
values read back from Prometheus, GPU names: any of them can be chosen by someone who is not the operator
(``prctl(PR_SET_NAME)`` needs no privilege; a Prometheus target can expose any label). Each sink has one
rule, written here once and used by every layer (this module imports nothing of gpuagent's):

- a terminal (and a log line): C0 and C1 controls, DEL, the line and paragraph separators, bidi controls and
  lone surrogates shown as visible escapes (``\\x1b``, ``\\u202e``): :func:`shown`. They would move the
  cursor, clear the screen, retitle the window, forge a log line or reorder what a reader sees;
- a label value of the exposition: the same (:func:`label_value`), so prometheus-client's own parser and
  every dashboard read it back as it was shown;
- a CSV cell: a leading formula character neutralised with ``'`` as OWASP says (:func:`csv_cell`);
- a Kubernetes object name that names a file or a patch: accepted only when Kubernetes would accept it
  (:func:`k8s_name_problem`), never "sanitised" into some other valid name;
- a file name under a directory: only a plain name whose final path stays inside (:func:`path_inside`);
- YAML: written by the serializer only, comments included (:func:`yaml_comment`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# C0, DEL, C1; U+061C arabic letter mark, U+200E/F LRM/RLM, U+202A-E embeddings and overrides, U+2066-9
# isolates; U+2028/9 (YAML and JavaScript read them as line breaks); lone surrogates (undecodable bytes kept
# by ``surrogateescape``: unencodable as UTF-8).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     r"\ud800-\udfff]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` with every control (C0, DEL, C1), line/paragraph separator, bidi control and lone surrogate
    as a visible escape; other text, backslashes included, unchanged (a name reads as it was)."""
    if _UNSAFE.search(text) is None:
        return text  # the common case: one scan, no copy
    return _UNSAFE.sub(_visible, text)


def shown_lines(text: str) -> str:
    """:func:`shown` for a text of several lines (a traceback): its line breaks kept, all else escaped."""
    return "\n".join(shown(line) for line in text.split("\n"))


def has_unsafe(text: str) -> bool:
    return _UNSAFE.search(text) is not None


label_value = shown  # a name entering the snapshot (and so the exposition, the API and the logs)

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def encodable(text: str) -> str:
    """``text`` with each lone surrogate (a JSON ``\\udcff`` escape, bytes kept by ``surrogateescape``) as
    U+FFFD: what every later step can encode as UTF-8 (a file, a pipe, a spreadsheet) without failing."""
    return text if _SURROGATE.search(text) is None else _SURROGATE.sub("\ufffd", text)


# -- CSV ---------------------------------------------------------------------------------------------------

# OWASP's formula starts, and their fullwidth forms: spreadsheets that normalise input (NFKC, East Asian
# IMEs) read U+FF1D as "=", and a leading "'" costs a name that starts with one nothing but a quote.
_FORMULA_START = frozenset("=+-@\t\r\uff1d\uff0b\uff0d\uff20")


def csv_cell(text: str) -> str:
    """A text cell a spreadsheet shows as text: one that starts a formula (``=``, ``+``, ``-``, ``@``, tab,
    CR, their fullwidth forms, also after leading spaces) gets a leading ``'``. Only for names: numbers
    are written as numbers (``-1.5`` stays a number)."""
    if text[:1] in _FORMULA_START or text.lstrip()[:1] in _FORMULA_START:
        return "'" + text
    return text


# -- Kubernetes names --------------------------------------------------------------------------------------

_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_QUALIFIED_NAME = re.compile("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
LABEL_MAX = 63
SUBDOMAIN_MAX = 253
# What apimachinery validates each kind's name as (NameIsDNSSubdomain for the workloads, NameIsDNSLabel for
# namespaces), and the shorter limits of some: a CronJob's 52 (its Jobs get an 11-character suffix).
NAME_RULES: Mapping[str, tuple[str, int]] = {
    "Namespace": ("label", LABEL_MAX), "Container": ("label", LABEL_MAX),
    "Deployment": ("subdomain", SUBDOMAIN_MAX), "StatefulSet": ("subdomain", SUBDOMAIN_MAX),
    "DaemonSet": ("subdomain", SUBDOMAIN_MAX), "ReplicaSet": ("subdomain", SUBDOMAIN_MAX),
    "Job": ("subdomain", SUBDOMAIN_MAX), "CronJob": ("subdomain", 52), "Pod": ("subdomain", SUBDOMAIN_MAX),
}


def k8s_name_problem(kind: str, name: str) -> str | None:
    """Why Kubernetes would refuse ``name`` for an object of ``kind`` (a key of :data:`NAME_RULES`), or
    None. The patterns are matched whole (``fullmatch``: ``$`` would let a trailing newline through)."""
    rule, longest = NAME_RULES[kind]
    pattern = _DNS1123_LABEL if rule == "label" else _DNS1123_SUBDOMAIN
    what = "a DNS-1123 label" if rule == "label" else "a DNS-1123 subdomain"
    if not name:
        return f"an empty {kind} name"
    if len(name) > longest:
        return f"{kind} name '{shown(name[:40])}'... is {len(name)} characters (at most {longest})"
    if pattern.fullmatch(name) is None:
        return f"{kind} name '{shown(name)}' is not {what} (lower-case letters, digits, '-'" + (
            ", '.')" if rule == "subdomain" else ")")
    return None


def qualified_name_problem(name: str) -> str | None:
    """Why ``name`` is not a Kubernetes qualified name (``[prefix/]name``: a resource or annotation key),
    or None."""
    prefix, slash, local = name.rpartition("/")
    if slash and (not prefix or len(prefix) > SUBDOMAIN_MAX or _DNS1123_SUBDOMAIN.fullmatch(prefix) is None):
        return f"key '{shown(name)}' has a prefix that is not a DNS-1123 subdomain"
    if not local or len(local) > LABEL_MAX or _QUALIFIED_NAME.fullmatch(local) is None:
        return f"key '{shown(name)}' is not a qualified name"
    return None


# -- paths -------------------------------------------------------------------------------------------------

NAME_MAX_BYTES = 255  # NAME_MAX of Linux file systems


def path_inside(directory: Path, name: str) -> Path:
    """``directory / name`` where ``name`` is one plain file name and the path (symbolic links followed)
    stays directly inside ``directory``; ``ValueError`` saying why otherwise."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or "\\" in name:
        raise ValueError(f"'{shown(name)}' is not a plain file name")
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX_BYTES:
        raise ValueError(f"'{shown(name[:40])}'... is longer than {NAME_MAX_BYTES} bytes")
    path = directory / name
    if path.resolve().parent != directory.resolve():
        raise ValueError(f"'{shown(name)}' leads outside {directory}")
    return path


# -- YAML --------------------------------------------------------------------------------------------------

def yaml_text(document: Any, *, width: int = 1 << 16, allow_unicode: bool = False) -> str:
    """``document`` as YAML, by the serializer (non-ASCII and controls escaped inside quoted scalars)."""
    import yaml  # lazily: the agent's poll path imports this module for its names alone

    return str(yaml.safe_dump(document, sort_keys=False, allow_unicode=allow_unicode, width=width))


def yaml_comment(fields: Mapping[str, Any], *, width: int = 1 << 16) -> str:
    """``fields`` as a YAML comment block: serialized as a mapping (escapes by the serializer), its values'
    controls shown first, then every line the serializer wrote (split at any line break YAML or Python
    knows) commented. No value can end the comment; what is left of Unicode once controls are shown is
    printable, and kept as it reads."""
    text = yaml_text({k: shown(v) if isinstance(v, str) else v for k, v in fields.items()}, width=width,
                     allow_unicode=True)
    return "".join(f"# {line}\n" for line in text.splitlines())
