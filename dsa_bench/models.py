"""Building blocks of the file-format models: closed and open base models, and field types shared by formats.

Each user-facing format has one pydantic model next to the code that reads it (the workload
YAML and trace line in :mod:`dsa_bench.workloads`, the solution manifest in
:mod:`dsa_bench.solution`, the packed Solution in :mod:`dsa_bench.pack.document`, the results
and baseline documents in :mod:`dsa_bench.results`). :func:`dsa_bench.files.check_document`
validates a document with its model and turns the first problem into one message.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class ClosedModel(BaseModel):
    """A part of a format dsa-bench defines completely: unknown fields are errors."""

    model_config = ConfigDict(strict=True, extra="forbid")


class OpenModel(BaseModel):
    """A part of a format that may carry more than dsa-bench reads (headers, blocks, the ecosystem's documents)."""

    model_config = ConfigDict(strict=True, extra="allow")


Name = Annotated[str, Field(min_length=1)]
