"""The constants of Philox4x32, the counter-based generator of the codecs' rounding noise (Triton's ``tl.randint4x``).

The Triton kernels (:mod:`composer_qsdp.kernels.noise`) and the torch reference of the same stream (``quant.philox``)
must use the same numbers, so both read them from here; this module needs neither torch nor Triton.
"""

__all__ = ["KEY_A", "KEY_B", "N_ROUNDS", "NOISE_ROUNDS", "ROUND_A", "ROUND_B"]

#: Philox rounds, Triton's default (``triton.language.random.N_ROUNDS_DEFAULT``).
N_ROUNDS = 10
#: Philox rounds of the codecs' rounding noise. Salmon et al. ("Parallel random numbers: as easy as 1, 2, 3",
#: SC'11, Table 2) find Philox4x32 passing all of TestU01's BigCrush from 7 rounds on and recommend 10 as a
#: safety margin; rounding noise asks less of a generator than a simulation does, and in the stochastic quantize
#: kernels, bound by instruction issue, every round is extra work per element.
NOISE_ROUNDS = 7
#: Key increments (Weyl constants) and round multipliers of Philox4x32, Triton's and Random123's.
KEY_A = 0x9E3779B9
KEY_B = 0xBB67AE85
ROUND_A = 0xD2511F53
ROUND_B = 0xCD9E8D57
