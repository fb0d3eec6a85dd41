"""Packing solutions as flashinfer-bench Solution JSON: collecting files, the document, unpacking
(``pack --verify`` runs them as flashinfer-bench imports them: :mod:`dsa_bench.flashinfer_bench.verify`)."""
