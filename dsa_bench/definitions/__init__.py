"""Registry of the kernel definitions dsa-bench knows.

Each definition lives in its own module and exposes ``DEFINITION``; adding one means adding its
module name here (a module defining a family exposes ``DEFINITIONS``, a tuple).
Definitions read from a flashinfer-bench dataset (:mod:`dsa_bench.definitions.from_dataset`) are
registered at run time.
"""

from __future__ import annotations

import importlib

from dsa_bench.definitions.base import Definition
from dsa_bench.errors import DsaBenchError

_BUILTIN_MODULES = ("indexer", "sparse_attention", "kv_insert", "mla_decode", "decode_step")
_extra: dict[str, Definition] = {}


def builtin_definitions() -> dict[str, Definition]:
    """The definitions dsa-bench ships (not those a dataset registered in this process)."""
    found: dict[str, Definition] = {}
    for module in _BUILTIN_MODULES:
        loaded = importlib.import_module(f"dsa_bench.definitions.{module}")
        for definition in getattr(loaded, "DEFINITIONS", None) or (loaded.DEFINITION,):
            found[definition.name] = definition
    return found


def all_definitions() -> dict[str, Definition]:
    """The shipped definitions and those registered from datasets in this process."""
    return {**builtin_definitions(), **_extra}


def get_definition(name: str) -> Definition:
    definitions = all_definitions()
    if name not in definitions:
        raise DsaBenchError(unknown_definition(name, list(definitions)))
    return definitions[name]


def unknown_definition(name: str, known: list[str]) -> str:
    """Why ``name`` is no definition, compactly: the closest known names and how to list them all."""
    import difflib

    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"closest: {', '.join(close)}; " if close else ""
    return f"unknown definition {name!r} ({hint}{len(known)} known: `dsa-bench list definitions` lists them)"


def register(definition: Definition) -> None:
    """Make a definition known for this process (used for definitions read from datasets)."""
    _extra[definition.name] = definition
