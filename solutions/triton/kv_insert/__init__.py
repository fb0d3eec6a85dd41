"""KV quantize-and-insert writers (``dsa_kv_insert_{v32,v4,v41}_fp8``); the entry points are in ``entry.py``."""
