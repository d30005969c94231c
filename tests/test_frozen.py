"""gpuagent.frozen: the faster constructors build the same objects as the ones dataclasses writes.

Each model class is rebuilt here twice from its own field definitions, once left as ``dataclasses`` makes
it and once given :func:`faster_init`; both are called with the same random arguments (positional,
keyword, defaults left out) and must give equal field values, raise the same errors for the same wrong
calls, and stay frozen.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
import pkgutil
import random
from typing import Any

import pytest

import gpuagent.snapshot
from gpuagent.accounting.idle import Observation
from gpuagent.enforce.timeslice import Tenant
from gpuagent.frozen import faster_init, faster_inits, rewritable
from gpuagent.snapshot.pods import PodUse
from gpuagent.snapshot.processes import ProcessSample

# Every module of the model package, each applying faster_inits to the classes it defines.
MODULES = [importlib.import_module(f"gpuagent.snapshot.{m.name}")
           for m in pkgutil.iter_modules(gpuagent.snapshot.__path__)]
MODEL = [cls for module in MODULES for cls in vars(module).values()
         if isinstance(cls, type) and cls.__module__ == module.__name__ and dataclasses.is_dataclass(cls)]


def twins(cls: type) -> tuple[type, type]:
    """The class as dataclasses writes it, and the same with faster_init, from ``cls``'s fields."""
    def rebuilt() -> type:
        namespace: dict[str, Any] = {"__annotations__": {}}
        for f in dataclasses.fields(cls):
            namespace["__annotations__"][f.name] = f.type
            if f.default is not dataclasses.MISSING:
                namespace[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                namespace[f.name] = dataclasses.field(default_factory=f.default_factory)
        return dataclasses.dataclass(frozen=True, slots=True)(type(cls.__name__, (), namespace))
    plain, fast = rebuilt(), faster_init(rebuilt())
    assert fast.__init__.__code__.co_filename != plain.__init__.__code__.co_filename
    return plain, fast


def values(rng: random.Random, count: int) -> list[Any]:
    pool = [None, 0, 1.5, -3, "x", "", (), ("a", 1), {"k": "v"}, frozenset({1}), True, float("nan")]
    return [rng.choice(pool) for _ in range(count)]


def fields_of(obj: Any) -> list[Any]:
    return [getattr(obj, f.name) for f in dataclasses.fields(obj)]


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))


def test_every_frozen_class_of_the_model_and_the_per_poll_ones_have_the_faster_constructor() -> None:
    assert len(MODEL) > 30
    for cls in [*MODEL, Tenant, Observation]:
        assert cls.__init__.__code__.co_filename == f"<{cls.__qualname__} faster_init>", cls
        assert not rewritable(cls)  # once is enough
    for module in MODULES:
        assert faster_inits(vars(module), module.__name__) == 0


@pytest.mark.parametrize("cls", [*MODEL, Tenant, Observation], ids=lambda c: c.__name__)
def test_the_same_objects_from_the_same_arguments(cls: type) -> None:
    plain, fast = twins(cls)
    assert str(inspect.signature(plain)) == str(inspect.signature(fast))  # a factory's default: <factory>
    fields = dataclasses.fields(cls)
    required = [f for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    rng = random.Random(cls.__name__)
    for _ in range(50):
        args = values(rng, len(fields))
        assert same(fields_of(plain(*args)), fields_of(fast(*args)))
        names = {f.name: v for f, v in zip(fields, args, strict=True)}
        kept = {k: v for k, v in names.items() if k in {f.name for f in required} or rng.random() < 0.5}
        a, b = plain(**kept), fast(**kept)
        assert same(fields_of(a), fields_of(b))
        for f in fields:  # a default factory's value is a new one at every call, as dataclasses makes it
            if f.default_factory is not dataclasses.MISSING and f.name not in kept:
                assert getattr(fast(**kept), f.name) is not getattr(b, f.name)
    for wrong in ((), values(rng, len(fields) + 1)):
        if not wrong and not required:
            continue
        with pytest.raises(TypeError):
            plain(*wrong)
        with pytest.raises(TypeError):
            fast(*wrong)
    with pytest.raises(TypeError):
        fast(*values(rng, len(required)), no_such_field=1)


def test_the_objects_stay_frozen_equal_hashable_copyable_and_picklable() -> None:
    process = ProcessSample(1, "python", "compute", 10, 5.0, None)
    same_process = ProcessSample(pid=1, comm="python", kind="compute", used_memory_bytes=10,
                                 sm_util_percent=5.0, memory_util_percent=None)
    assert process == same_process and hash(process) == hash(same_process)
    with pytest.raises(dataclasses.FrozenInstanceError):
        process.pid = 2  # type: ignore[misc]
    assert copy.copy(process) == process == pickle.loads(pickle.dumps(process))
    assert dataclasses.replace(process, pid=2).pid == 2
    pod = PodUse(name="p", namespace="ns")
    assert pod.annotations == {} and pod.annotations is not PodUse(name="q").annotations


def test_classes_it_cannot_rewrite_exactly_keep_their_constructor() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class WithPostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class KeywordOnly:
        a: int = dataclasses.field(kw_only=True)

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        a: int

    for cls in (WithPostInit, KeywordOnly, NoSlots, NotFrozen):
        init = cls.__init__
        assert faster_init(cls) is cls and cls.__init__ is init
