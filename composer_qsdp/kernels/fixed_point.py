"""The grid of the fixed-point stochastic rounding that the min-max kernels and their torch reference share
(:mod:`composer_qsdp.kernels.noise`, ``quant.minmax``); plain Python, so the torch side imports no Triton."""

__all__ = ["NOISE_BITS", "fraction_bits"]

#: Bits of one rounding-noise value ``k`` (``quant.philox.rounding_bits``).
NOISE_BITS = 16


def fraction_bits(bits: int) -> int:
    """Fraction bits ``F`` of the fixed-point stochastic rounding of ``bits``-bit codes: ``min(16, 22 - bits)``.

    A value ``t`` in ``[0, 2**bits)`` plus ``1.5 * 2**(23 - F)`` lands in ``[2**(23 - F), 2**(24 - F))``, where fp32
    numbers are exactly the multiples of ``2**-F``: the float add rounds ``t`` to ``t_F`` on that grid, and adding
    the top ``F`` bits of a noise value ``k`` to the sum's bit pattern and dropping the low ``F`` bits gives
    ``floor(t_F + k_F / 2**F)``, whose mean over the ``2**F`` values ``k_F`` is exactly ``t_F`` (within
    ``2**-(F + 1)`` of ``t``: ``2**-17`` of a step up to 6 bits, ``2**-15`` at 8).
    """
    return min(NOISE_BITS, 22 - bits)
