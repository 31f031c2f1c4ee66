"""Codecs: a tensor -> one flat ``uint8`` wire buffer (codes + per-bucket metadata) -> a tensor.

Pure math with a torch reference implementation; on CUDA tensors the hot codecs dispatch to the Triton
kernels of :mod:`composer_qsdp.kernels`. Knows nothing of distributed training.
"""

from composer_qsdp.quant.codec import FLOAT_DTYPES, Codec, check_int
from composer_qsdp.quant.philox import check_seed
from composer_qsdp.quant.registry import codec_names, make_codec

__all__ = ["FLOAT_DTYPES", "Codec", "check_int", "check_seed", "codec_names", "make_codec"]
