"""Stores of fp32 kernel results into the output dtype with round-to-nearest-even, on a GPU and under the interpreter.

A GPU's fp32 -> bf16 conversion rounds to nearest even, as torch's ``.to(torch.bfloat16)`` does, but the
Triton interpreter truncates. Kernels whose output may be bf16 store through :func:`store_cast` with
``EMULATE_BF16_RNE=emulate_bf16_rne()``, which rounds with integer operations under the interpreter so CI
checks the same numbers the GPU produces.
"""

import triton
import triton.language as tl

from composer_qsdp.kernels.dispatch import interpreter_enabled

__all__ = ["emulate_bf16_rne", "store_average", "store_cast"]


def emulate_bf16_rne() -> bool:
    """Value of ``store_cast``'s ``EMULATE_BF16_RNE`` for a launch: True under the Triton interpreter."""
    return interpreter_enabled()


@triton.jit
def store_cast(ptr, y, mask, EMULATE_BF16_RNE: tl.constexpr):
    """Store fp32 ``y`` as ``ptr``'s dtype, rounding to nearest even (NaN stays NaN)."""
    if EMULATE_BF16_RNE and ptr.dtype.element_ty == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        rounded = tl.where(y == y, (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16, 0x7FC0)
        tl.store(ptr, rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(ptr, y.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_average(ptr, y, mask, divisor, DIVIDE: tl.constexpr, EMULATE_BF16_RNE: tl.constexpr):
    """:func:`store_cast` of fp32 ``y``, divided first by ``divisor`` with ``DIVIDE`` (one IEEE division, ``div_rn``,
    as the codecs' torch references divide a reduce-scatter's sum): the average rounded once to ``ptr``'s dtype."""
    if DIVIDE:
        y = tl.math.div_rn(y, tl.full(y.shape, divisor, tl.float32))
    store_cast(ptr, y, mask, EMULATE_BF16_RNE)
