"""Helpers shared by the solution's kernel families: just-in-time CUDA builds, CUDA-graph replay, shared Triton math."""
