"""The one error every bad configuration input raises, ``ConfigError``, naming where it came from and the key.
It lives apart from the parsers and the loader because the file readers (:mod:`gpuagent.config.files`),
the loader and readers outside this package (the TLS web config, the extender's options, the simulator's
scenario) raise it too, and none of them should have to import the key table to do so.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value (or file), with where it came from.

    ``source`` is a file path, ``env NAME`` or ``flag --name``; env and flag sources already name the
    key, so ``str()`` leaves the key path out for them.
    """

    def __init__(self, key_path: str, message: str, source: str) -> None:
        super().__init__(key_path, message, source)
        self.key_path = key_path
        self.message = message
        self.source = source

    def __str__(self) -> str:
        if not self.key_path or self.source.startswith(("env ", "flag ")):
            return f"{self.source}: {self.message}"
        return f"{self.source}: {self.key_path}: {self.message}"
