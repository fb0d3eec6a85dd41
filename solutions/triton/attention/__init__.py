"""The sparse MLA attention (``dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64``); its entry point is ``entry.kernel``."""
