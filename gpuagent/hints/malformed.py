"""Bodies the extender is sent that are not shaped as the API says: the error that names where
(:class:`MalformedPod`, answered with a 400) and the words for what was there instead (:func:`json_kind`).

The Pod's own fields (``podrequest``) and its DRA claims (``claims``) both raise them, and ``podrequest``
takes the claims' result: they live here, below both, so neither imports the other for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class MalformedPod(ValueError):
    """The Pod JSON is not shaped like a v1 Pod; ``field`` is the path within the ExtenderArgs."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def json_kind(value: Any) -> str:
    """What a JSON value is, for an error message: "null", "an object", "a list", or the value itself."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return repr(value)[:64]
