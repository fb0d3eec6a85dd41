"""Helpers shared by the solution's kernel families: just-in-time CUDA builds and CUDA-graph replay."""
