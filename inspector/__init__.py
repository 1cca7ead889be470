"""mtpscope's inspector: our GGUF reader, the tensor inventory, validation and drafter layouts.

The public names below are imported lazily (PEP 562) so that ``import mtpscope.errors`` (done by the
CLI at start-up) does not pull in numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "open_gguf", "GGUFFile", "TensorInfo", "KeyValue", "ArrayValue",
    "build_inventory", "Inventory", "TensorEntry", "Dialect",
]

_FROM = {
    "open_gguf": "mtpscope.inspector.gguf", "GGUFFile": "mtpscope.inspector.gguf", "TensorInfo": "mtpscope.inspector.gguf",
    "KeyValue": "mtpscope.inspector.gguf", "ArrayValue": "mtpscope.inspector.gguf",
    "build_inventory": "mtpscope.inspector.inventory", "Inventory": "mtpscope.inspector.inventory",
    "TensorEntry": "mtpscope.inspector.inventory", "Dialect": "mtpscope.inspector.inventory",
}

if TYPE_CHECKING:
    from mtpscope.inspector.gguf import ArrayValue, GGUFFile, KeyValue, TensorInfo, open_gguf
    from mtpscope.inspector.inventory import Dialect, Inventory, TensorEntry, build_inventory


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module 'inspector' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
