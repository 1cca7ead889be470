"""Any frozen dataclass as a JSON header and a list of numpy arrays, and back: how the recording worker and
the recorder exchange rounds and jobs (:mod:`traces.run.transport` moves the bytes).

Rounds are generic: :func:`pack` turns any (frozen) dataclass into a JSON header and a list of
arrays -- ``np.ndarray`` fields become arrays, tuples of dataclasses are packed item by item, every
other value (numbers, strings, ``None``, tuples of those) goes into the header -- and :func:`unpack`
rebuilds it, importing the classes by name (only from ``mtpscope.`` modules; nothing is unpickled).
A field added to the round or step records passes through without any change here.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from mtpscope.errors import TraceError


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


@functools.cache      # each transport name checked and imported once per process (a round names four)
def _resolve(name: str) -> type:
    mod, _, qual = name.partition(":")
    if not (mod == "mtpscope" or mod.startswith("mtpscope.")) or not qual:
        raise TraceError("transport refuses a record type outside mtpscope", key="__type__",
                         expected="mtpscope.<module>:<class>", actual=name)
    obj: Any = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise TraceError("transport record type is not a dataclass", key="__type__", actual=name)
    return obj


#: per dataclass: its transport name and field names (``dataclasses.fields`` is slow for a per-round path)
_FIELDS: dict[type, tuple[str, tuple[str, ...]]] = {}
_SCALARS = (bool, int, float, str, type(None))
#: what a header holds besides scalars (JSON's arrays and objects)
_NESTED = (list, dict)


def _fields_of(cls: type) -> tuple[str, tuple[str, ...]] | None:
    got = _FIELDS.get(cls)
    if got is None and dataclasses.is_dataclass(cls):
        got = _FIELDS[cls] = (_type_name(cls), tuple(f.name for f in dataclasses.fields(cls)))
    return got


def pack(obj: Any) -> tuple[dict[str, Any], list[np.ndarray]]:
    """A dataclass instance as ``(header, arrays)``: ``header`` JSON-able, arrays in header order.

    Raises:
        TypeError: a field value that is neither JSON-able, an array, nor a dataclass (or tuple of).
    """
    arrays: list[np.ndarray] = []

    def walk(v: Any) -> Any:
        t = type(v)
        if t in _SCALARS:
            return v
        if t is tuple or t is list:            # (scalars inline: a list of token ids costs no call per item)
            return [x if type(x) in _SCALARS else walk(x) for x in v]
        if isinstance(v, np.ndarray):
            arrays.append(v)
            return {"__array__": len(arrays) - 1}
        fl = _fields_of(t)
        if fl is not None:
            return {"__type__": fl[0], "fields": {n: walk(getattr(v, n)) for n in fl[1]}}
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, _SCALARS):            # subclasses (an IntEnum, ...)
            return v
        if isinstance(v, (tuple, list)):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {"__dict__": {str(k): walk(x) for k, x in v.items()}}
        raise TypeError(f"cannot pack a {type(v).__name__} field")

    return walk(obj), arrays


def unpack(header: dict[str, Any], arrays: Sequence[np.ndarray]) -> Any:
    """Inverse of :func:`pack` (lists come back as tuples).

    Raises:
        TraceError: a type outside ``mtpscope`` or not a dataclass; an array index out of range.
    """

    def walk(v: Any) -> Any:
        if isinstance(v, list):
            return tuple([walk(x) if type(x) in _NESTED else x for x in v])
        if isinstance(v, dict):
            if "__array__" in v:
                i = v["__array__"]
                if not isinstance(i, int) or not 0 <= i < len(arrays):
                    raise TraceError("transport message names an array it does not carry", key="__array__",
                                     expected=f"0..{len(arrays) - 1}", actual=i)
                return arrays[i]
            if "__type__" in v:
                cls = _resolve(v["__type__"])
                return cls(**{k: walk(x) for k, x in v["fields"].items()})
            if "__dict__" in v:
                return {k: walk(x) for k, x in v["__dict__"].items()}
        return v

    return walk(header)
