"""Packing solutions as flashinfer-bench Solution JSON: collecting files, the document, unpacking, verifying."""
