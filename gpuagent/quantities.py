"""Limit values as people write them: GPU shares ("30%") and Kubernetes memory quantities ("8Gi").

Pure parsing, shared by the enforcer's policies (``enforce/rules.py``, which documents the rules) and the
scheduling hints (``hints/``), so both read a value the same way. Bad values raise ``PolicyValueError``
saying what was expected and what came; nothing is guessed. Both read every pod's annotations on every
poll, and a pod-dense node repeats a handful of values hundreds of times, so the texts that parse are
remembered (short ones only, a bounded number: a value from an API request cannot grow the memory).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

MEMORY_MAX_BYTES = 2**63 - 1  # a Kubernetes quantity's int64
MAX_TEXT = 64  # longer values are refused before any arithmetic
_NUMBER = r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+"
_SHARE_RE = re.compile(rf"({_NUMBER})(%?)", re.ASCII)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY_RE = re.compile(
    rf"([+-]?)({_NUMBER})(?:(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)|[eE]([+-]?[0-9]+))?", re.ASCII
)
_NUMBER_AND_UNIT_RE = re.compile(rf"[+-]?(?:{_NUMBER})\s*([A-Za-z]+)", re.ASCII)
_EXPONENT_AND_UNIT_RE = re.compile(rf"[+-]?(?:{_NUMBER})[eE][+-]?[0-9]+\s*[A-Za-z]+", re.ASCII)
MEMORY_EXPECTED = "a Kubernetes memory quantity like 8Gi, 512Mi, 8G or plain bytes"
_REMEMBERED = 1024  # distinct texts that parsed, per parser


class PolicyValueError(ValueError):
    """A value that is not a valid limit: ``message`` says what was expected and what came.

    ``key_path`` names where it was (``policies[2].gpu_share``) for config errors, "" for a bare value.
    """

    def __init__(self, message: str, key_path: str = "") -> None:
        super().__init__(message, key_path)
        self.message = message
        self.key_path = key_path

    def __str__(self) -> str:
        return f"{self.key_path}: {self.message}" if self.key_path else self.message


def quoted(value: object) -> str:
    """A value as messages quote it, cut short when long."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > MAX_TEXT:
        text = text[: MAX_TEXT - 3] + "..."
    return repr(text)


def share_from_number(number: float | Fraction, shown: str, *, percent_sign: bool = False) -> float:
    if not (isinstance(number, Fraction) or math.isfinite(number)) or not 0 < number <= 100:
        raise PolicyValueError(f"expected a percent in (0, 100] like 30 or 30%, got {quoted(shown)}")
    if number < 1 and not percent_sign:
        raise PolicyValueError(
            f"ambiguous share {quoted(shown)}: it reads as {shown} percent; write {_percent_text(number)} "
            f"for {_percent_text(number)} percent of the GPU, or {shown}% for less than one percent"
        )
    return float(Fraction(number) / 100)


def _percent_text(fraction_of_one: float | Fraction) -> str:
    return f"{float(fraction_of_one) * 100:g}"


def parse_share(value: str) -> float:
    """A GPU share: "30" or "30%" (percent of a GPU's SM time, in (0, 100]) as a ratio, 0.30."""
    if isinstance(value, str) and len(value) <= MAX_TEXT:
        return _remembered_share(value)
    return _parse_share(value)


def parse_memory(value: str) -> int:
    """A Kubernetes memory quantity ("8Gi", "512Mi", "8G", "1.5Gi", "8589934592") in bytes, > 0."""
    if isinstance(value, str) and len(value) <= MAX_TEXT:
        return _remembered_memory(value)
    return _parse_memory(value)


def _parse_share(value: str) -> float:
    text = value.strip() if isinstance(value, str) else value
    match = _SHARE_RE.fullmatch(text) if isinstance(text, str) and len(text) <= MAX_TEXT else None
    if match is None:
        raise PolicyValueError(f"expected a percent in (0, 100] like 30 or 30%, got {quoted(value)}")
    return share_from_number(Fraction(match[1]), text, percent_sign=bool(match[2]))


def _parse_memory(value: str) -> int:
    text = value.strip() if isinstance(value, str) else value
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise PolicyValueError(f"expected {MEMORY_EXPECTED}, got {quoted(value)}")
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise PolicyValueError(f"expected {MEMORY_EXPECTED}, got {quoted(value)}{_unit_hint(text)}")
    sign, number, suffix, exponent = match.groups()
    amount = Fraction(number)
    if sign == "-" or amount == 0:
        raise PolicyValueError(f"expected a memory size > 0, got {quoted(value)}")
    if suffix:
        amount *= _BINARY.get(suffix) or _DECIMAL[suffix]
    elif exponent is not None:
        # |power| <= 200 leaves every 64-character number far outside [1, int64] beyond it: no huge powers
        power = max(-200, min(200, int(exponent)))
        amount *= Fraction(10) ** power
    if amount < 1:
        raise PolicyValueError(f"expected a memory size of at least one byte, got {quoted(value)}")
    size = math.ceil(amount)
    if size > MEMORY_MAX_BYTES:
        raise PolicyValueError(f"expected at most {MEMORY_MAX_BYTES} bytes, got {quoted(value)}")
    return size


# A text that does not parse raises every time (lru_cache keeps results only), with the same message.
_remembered_share = lru_cache(maxsize=_REMEMBERED)(_parse_share)
_remembered_memory = lru_cache(maxsize=_REMEMBERED)(_parse_memory)


def _unit_hint(text: str) -> str:
    """Why a number with a unit is not a quantity, when the unit is a near miss of a Kubernetes suffix."""
    if _EXPONENT_AND_UNIT_RE.fullmatch(text):
        return " (as in Kubernetes, an exponent takes no suffix: write 1000Gi, not 1e3Gi)"
    match = _NUMBER_AND_UNIT_RE.fullmatch(text)
    if match is None:
        return ""
    unit = match[1]
    head = text[: match.start(1)].rstrip()
    if unit == "m":
        return f" ('m' is milli, thousandths of a byte: did you mean {head}Mi or {head}M?)"
    bare = unit[:-1] if len(unit) > 1 and unit[-1] in "bB" else unit  # GB, GiB, gb
    for binary in _BINARY:
        if bare.lower() == binary.lower():
            return f" (did you mean {head}{binary}? suffixes are case-sensitive)"
    for decimal in _DECIMAL:
        if bare.lower() == decimal.lower():
            binary = decimal.upper() + "i" if decimal != "k" else "Ki"
            return f" (did you mean {head}{decimal} or {head}{binary}? suffixes are case-sensitive)"
    return ""
