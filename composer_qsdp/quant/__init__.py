"""Codecs: a tensor -> one flat ``uint8`` wire buffer (codes + per-bucket metadata) -> a tensor.

Pure math with a torch reference implementation; on CUDA tensors the hot codecs dispatch to the Triton
kernels of :mod:`composer_qsdp.kernels`. Knows nothing of distributed training.

Other layers build codecs by name with :func:`make_codec` (:func:`codec_names` lists the names of
:data:`composer_qsdp.registry.CODECS`) and talk to the
:class:`Codec` interface only. The codec classes are exported for direct use and for tests; the general argument
checks are in :mod:`composer_qsdp.validate`.
"""

from composer_qsdp.quant.codec import FLOAT_DTYPES, MAX_BUCKET_SIZE, Codec
from composer_qsdp.quant.hadamard import FusedRotation, HadamardCodec, hadamard_rows, hadamard_rows_
from composer_qsdp.quant.learned import LearnedLevelsCodec
from composer_qsdp.quant.minmax import MinMaxCodec
from composer_qsdp.quant.random_shift import RandomShiftCodec
from composer_qsdp.quant.build import codec_names, make_codec
from composer_qsdp.quant.residual import CodedResidual
from composer_qsdp.quant.sign import SignCodec
from composer_qsdp.quant.symmetric import SymmetricCodec

__all__ = [
    "FLOAT_DTYPES", "MAX_BUCKET_SIZE", "Codec", "CodedResidual", "FusedRotation", "HadamardCodec", "LearnedLevelsCodec",
    "MinMaxCodec", "RandomShiftCodec", "SignCodec", "SymmetricCodec", "codec_names", "hadamard_rows", "hadamard_rows_",
    "make_codec",
]
