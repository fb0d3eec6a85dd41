"""The smallest kernels, timed beside a small call to show its floor: an empty launch, one load,
and two dependent loads (a T = 1 KV insert reads a slot, then the row it names). Imported only
after a dry run has set TRITON_INTERPRET."""

import triton
import triton.language as tl


@triton.jit
def empty(x_ptr):
    pass


@triton.jit
def one_load(src_ptr, dst_ptr):
    tl.store(dst_ptr, tl.load(src_ptr))


@triton.jit
def two_dependent_loads(src_ptr, dst_ptr):
    tl.store(dst_ptr, tl.load(src_ptr + tl.load(src_ptr)))
