"""Registry of the kernel definitions dsa-bench knows.

Each definition lives in its own module and exposes ``DEFINITION``; adding one means adding its
module name here (a module defining a family exposes ``DEFINITIONS``, a tuple).
Definitions read from a flashinfer-bench dataset are registered at run time.
"""

from __future__ import annotations

import importlib

from dsa_bench.definitions.base import Definition
from dsa_bench.errors import DsaBenchError, did_you_mean, name_list

_BUILTIN_MODULES = ("indexer", "sparse_attention", "kv_insert", "mla_decode")
_extra: dict[str, Definition] = {}


def all_definitions() -> dict[str, Definition]:
    found: dict[str, Definition] = {}
    for module in _BUILTIN_MODULES:
        loaded = importlib.import_module(f"dsa_bench.definitions.{module}")
        for definition in getattr(loaded, "DEFINITIONS", None) or (loaded.DEFINITION,):
            found[definition.name] = definition
    found.update(_extra)
    return found


def get_definition(name: str) -> Definition:
    definitions = all_definitions()
    if name not in definitions:
        hint = did_you_mean(name, definitions)
        raise DsaBenchError(f"unknown definition {name!r}{hint}; the known definitions:\n{name_list(sorted(definitions))}")
    return definitions[name]


def register(definition: Definition) -> None:
    """Make a definition known for this process (used for definitions read from datasets)."""
    _extra[definition.name] = definition
