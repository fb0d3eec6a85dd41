"""The lightning indexer (``dsa_topk_indexer_fp8_h64_d128_topk2048_ps64``); its entry point is ``entry.kernel``."""
