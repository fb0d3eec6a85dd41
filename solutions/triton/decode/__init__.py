"""FlashMLA-style sparse decode over paged FP8 KV records (``dsa_mla_decode_{v32,v4,v41}_fp8``); entry points in ``entry.py``."""
