"""dsa-bench: a harness for DeepSeek Sparse Attention kernels.

The package follows the pipeline it runs (docs/architecture.md): ``definitions`` (the kernel
contracts), ``workloads`` (what to run), ``solution`` (solution folders), ``run`` (planning a run,
the isolated workers, judging), ``timing``, ``results`` (records, baselines, compare, report),
``pack`` (flashinfer-bench Solution JSON), ``flashinfer_bench`` (its datasets, packed solutions
and traces) and ``cli``.
"""

__version__ = "0.1.0"
