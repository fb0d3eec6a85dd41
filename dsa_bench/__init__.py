"""dsa-bench: a harness for DeepSeek Sparse Attention kernels.

The library is split by concern: ``definitions`` (kernel contracts and their references),
``kv_formats`` (byte layouts of KV records), ``workloads`` (workload files and traces),
``solutions`` (solution folders and their entry points), ``timing``, ``checking``,
``worker`` (the isolated solution process), ``runner``, ``results`` and ``cli``.
"""

__version__ = "0.1.0"
