"""One DSA decode step (``dsa_decode_step_{v32,v4}``) composed of this solution's kernels; entry points in ``entry.py``."""
