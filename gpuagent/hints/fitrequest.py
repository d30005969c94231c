"""A GPU request to fit and score (``FitRequest``), and its one parser: ``/v1/hints/score`` bodies and pods.

A request asks for ``gpus`` GPUs, each with:

- ``exclusive``: the whole GPU, no other tenant (not MIG-enabled);
- ``mig_profile``: one MIG instance of that profile (an idle one, or room to create one); ``gpus`` counts
  instances;
- otherwise a shared GPU (time-sliced or MPS): ``share`` of its SM time (0-1) must be schedulable, and any
  schedulable time at all when no share is given;

``memory`` (bytes) free on each GPU (or in the instance for MIG), and a ``policy``. ``parse_fit_request``
reads the JSON body of ``POST /v1/hints/score``; a pod's request (``hints.podrequest``) is turned into the
same body and read by the same function, so a pod and a score call are held to the same rules. Nothing from
outside is trusted: every value is type- and range-checked here, and a bad one raises ``RequestError``
naming the field.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuagent.quantities import MEMORY_MAX_BYTES, PolicyValueError, parse_memory, parse_share

POLICIES = ("binpack", "spread")
MAX_GPUS = 64
FIELDS = ("gpus", "memory", "share", "mig_profile", "exclusive", "policy")

_MIG_PROFILE_RE = re.compile(r"([1-46-8])g\.([1-9][0-9]{0,3})gb(?:\+(?:me|me\.all|gfx)|-me)?", re.ASCII)
_BYTE_UNIT_RE = re.compile(r"(.*?[0-9.])\s*(Ki|Mi|Gi|Ti|Pi|Ei|[kKMGTPE])B", re.ASCII)


class RequestError(ValueError):
    """A request that cannot be scored: ``field`` names the request key, ``message`` what was wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class FitRequest:
    gpus: int = 1
    memory_bytes: int | None = None
    share: float | None = None  # ratio of a GPU's SM time, (0, 1]
    mig_profile: str | None = None
    exclusive: bool = False
    policy: str = "binpack"


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_request_memory(value: object) -> int:
    """Bytes from an integer, a Kubernetes quantity ("20Gi", "20G") or a byte unit ("20GB", "20GiB")."""
    if _is_int(value):
        assert isinstance(value, int)
        if not 0 < value <= MEMORY_MAX_BYTES:
            raise RequestError("memory", f"expected bytes > 0 and <= {MEMORY_MAX_BYTES}, got {value}")
        return value
    if not isinstance(value, str):
        raise RequestError("memory", f"expected bytes (an integer) or a quantity like \"20Gi\", got "
                                     f"{_type_name(value)}")
    text = value.strip()
    unit = _BYTE_UNIT_RE.fullmatch(text)
    if unit is not None:  # "20GB" is 20 G, "20GiB" 20 Gi, "512KB" 512 k
        text = unit[1] + ("k" if unit[2] == "K" else unit[2])
    try:
        return parse_memory(text)
    except PolicyValueError as error:
        raise RequestError("memory", error.message) from None


def _parse_share(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value <= 1:  # NaN fails this too
            raise RequestError("share", f"expected a ratio of a GPU's SM time in (0, 1], got {value!r}")
        return float(value)
    if isinstance(value, str):
        try:
            return parse_share(value)
        except PolicyValueError as error:
            raise RequestError("share", error.message) from None
    raise RequestError("share", f"expected a ratio in (0, 1] or a percent like \"30%\", got "
                                f"{_type_name(value)}")


def _parse_profile(value: object) -> str:
    if not isinstance(value, str):
        raise RequestError("mig_profile", f"expected a MIG profile like \"1g.10gb\", got {_type_name(value)}")
    if _MIG_PROFILE_RE.fullmatch(value) is None:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise RequestError("mig_profile", f"unknown MIG profile {shown!r}: expected <slices>g.<memory>gb "
                                          "like 1g.10gb, 3g.40gb or 1g.10gb+me")
    return value


def parse_fit_request(body: object) -> FitRequest:
    """A ``FitRequest`` from the JSON body of ``/v1/hints/score``; raises ``RequestError(field, message)``."""
    if not isinstance(body, Mapping):
        raise RequestError("body", f"expected a JSON object with {', '.join(FIELDS)}, got {_type_name(body)}")
    for key in body:
        if key not in FIELDS:
            hint = difflib.get_close_matches(str(key), FIELDS, n=1)
            known = f"did you mean {hint[0]}?" if hint else "known fields: " + ", ".join(FIELDS)
            raise RequestError(str(key)[:64], f"unknown field; {known}")
    gpus = body.get("gpus", 1)
    if not _is_int(gpus):
        raise RequestError("gpus", f"expected an integer from 1 to {MAX_GPUS}, got {_type_name(gpus)}")
    if not 1 <= gpus <= MAX_GPUS:
        raise RequestError("gpus", f"expected an integer from 1 to {MAX_GPUS}, got {gpus}")
    memory = body.get("memory")
    share = body.get("share")
    profile = body.get("mig_profile")
    exclusive = body.get("exclusive", False)
    if not isinstance(exclusive, bool):
        raise RequestError("exclusive", f"expected true or false, got {_type_name(exclusive)}")
    policy = body.get("policy", "binpack")
    if policy not in POLICIES:
        shown = _type_name(policy) if not isinstance(policy, str) else repr(policy[:40])
        raise RequestError("policy", f"expected one of {', '.join(POLICIES)}, got {shown}")
    request = FitRequest(
        gpus=gpus,
        memory_bytes=None if memory is None else parse_request_memory(memory),
        share=None if share is None else _parse_share(share),
        mig_profile=None if profile is None else _parse_profile(profile),
        exclusive=exclusive,
        policy=policy,
    )
    if request.exclusive and request.share is not None:
        raise RequestError("share", "an exclusive request takes the whole GPU: leave share out")
    if request.mig_profile is not None and request.exclusive:
        raise RequestError("exclusive", "a MIG instance is isolated already: leave exclusive out")
    if request.mig_profile is not None and request.share is not None:
        raise RequestError("share", "a MIG instance's share is its slices: leave share out")
    return request


def kind_name(request: FitRequest) -> str:
    """Which kind of request: "shared", "exclusive" or "mig" (the ``NodeIndex`` attribute it is sized on)."""
    if request.mig_profile is not None:
        return "mig"
    return "exclusive" if request.exclusive else "shared"
