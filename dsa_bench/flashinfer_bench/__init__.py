"""flashinfer-bench's formats, in and out, in one place: a dataset folder's workloads and solutions
read as dsa-bench workloads (``dataset.py``), a packed Solution laid out and imported as
flashinfer-bench imports it (``packed.py``) and run that way by ``pack --verify`` (``verify.py``),
and a results file written as flashinfer-bench traces (``traces.py``).

A dataset's definition JSONs become definitions beside dsa-bench's own, in
:mod:`dsa_bench.definitions.from_dataset`; the packed Solution schema and ``pack``/``unpack`` are
:mod:`dsa_bench.pack`.
"""
