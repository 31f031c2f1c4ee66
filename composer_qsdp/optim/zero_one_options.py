"""The checks of ``ZeroOneAdam``'s options and parameters, and the codecs its options name.

Each check raises a ``ValueError`` that names the option (or the parameter, by its index among the trainable
ones), the value given and what is allowed; nothing here keeps state.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from composer_qsdp.quant import Codec, make_codec

__all__ = ["bits_per_element", "check_group", "check_max_grad_norm", "check_param", "default_bucket_size",
           "make_variance_codec", "param_tensors"]


def default_bucket_size(params: Iterable[torch.Tensor]) -> int:
    """The default bucket of ZeroOneAdam over ``params`` (elements): the largest power of two up to 256 that divides
    the row length (last dimension) of every trainable matrix, so that no bucket spans two rows (two tokens'
    embeddings, two units' weights), which can differ in scale by orders of magnitude; 256 when that power of two
    would be below 32 (odd widths: the scales' overhead, 32 bits each, would outweigh the 1-bit codes)."""
    size = math.gcd(256, *(p.shape[-1] for p in params if p.dim() >= 2 and p.requires_grad))
    return size if size >= 32 else 256


def make_variance_codec(spec: str | Mapping[str, Any] | None, bucket_size: int) -> Codec | None:
    """The codec of ``variance_codec``: a codec name (its default bits: ``"symmetric"`` is 8-bit) or a mapping of
    :func:`~composer_qsdp.quant.make_codec` options with the name, at the optimizer's bucket size unless given."""
    if spec is None:
        return None
    allowed = ("allowed: None (fp32 all-reduces), a deterministic codec name such as 'symmetric' (8 bits), or a "
               "mapping such as {'name': 'symmetric', 'bits': 8}")
    options = {"name": spec} if isinstance(spec, str) else dict(spec) if isinstance(spec, Mapping) else None
    if options is None or not isinstance(options.get("name"), str):
        raise ValueError(f"variance_codec={spec!r} is invalid; {allowed}")
    options.setdefault("bucket_size", bucket_size)
    if isinstance(options["bucket_size"], int) and options["bucket_size"] > 0 and bucket_size % options["bucket_size"]:
        raise ValueError(f"variance_codec={spec!r} has bucket_size={options['bucket_size']}, which does not divide the "
                         f"optimizer's bucket_size={bucket_size} (its buckets would span two tensors); allowed: a "
                         "divisor of it, or no bucket_size (the optimizer's)")
    try:
        codec = make_codec(**options)
    except ValueError as err:
        raise ValueError(f"variance_codec={spec!r}: {err}") from None
    if codec.unbiased:
        raise ValueError(f"variance_codec={spec!r} rounds stochastically; {allowed} (minmax needs "
                         "rounding='nearest')")
    return codec


def bits_per_element(codec: Codec | None) -> float:
    """Bits ``codec`` sends per element, scales included (32 without a codec: fp32)."""
    if codec is None:
        return 32.0
    numel = codec.bucket_size * 1024
    return codec.wire_bytes(numel) * 8 / numel


def check_max_grad_norm(value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 < value < math.inf):
        raise ValueError(f"max_grad_norm={value!r} is invalid; it must be a finite number > 0, or None (no clipping)")


def param_tensors(item: torch.Tensor | dict[str, Any]) -> list[torch.Tensor]:
    """The parameters of one entry of an optimizer's ``params`` (a tensor or a parameter group)."""
    if not isinstance(item, dict):
        return [item]
    group = item["params"]
    return [group] if isinstance(group, torch.Tensor) else list(group)


def check_group(group: dict[str, Any], index: int) -> None:
    """Raise a ValueError naming the first option of parameter group ``index`` that is out of range; make its
    ``betas`` a tuple of floats."""
    lr, betas, eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 <= lr < math.inf:
        raise ValueError(f"lr={lr!r} (parameter group {index}) is invalid; it must be a finite number >= 0")
    if (not isinstance(betas, (tuple, list)) or len(betas) != 2
            or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)):
        raise ValueError(f"betas={betas!r} (parameter group {index}) is invalid; it must be two numbers in [0, 1)")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:
        # eps = 0 divides by sqrt(v) = 0 where a variance update saw no gradient since the element last moved.
        raise ValueError(f"eps={eps!r} (parameter group {index}) is invalid; it must be a finite number > 0")
    if isinstance(wd, bool) or not isinstance(wd, (int, float)) or not 0 <= wd < math.inf:
        raise ValueError(f"weight_decay={wd!r} (parameter group {index}) is invalid; it must be a finite number >= 0")
    if not isinstance(group["bias_correction"], bool):
        raise ValueError(f"bias_correction={group['bias_correction']!r} (parameter group {index}) is invalid; "
                         "allowed: True, False")
    group["betas"] = tuple(float(b) for b in betas)


def check_param(p: torch.Tensor, index: int, first: torch.Tensor) -> None:
    """Raise a ValueError naming trainable parameter ``index`` when 0/1 Adam cannot hold it (``first``: trainable
    parameter 0, whose device every parameter shares)."""
    # A DTensor exists only once its module is imported (importing it here would cost seconds); FSDP1's
    # FlatParameter lives in a private module: compare the name.
    dtensor = sys.modules.get("torch.distributed.tensor")
    if (dtensor is not None and isinstance(p, dtensor.DTensor)) or type(p).__name__ == "FlatParameter":
        raise ValueError(f"parameter {index} is sharded ({type(p).__name__}): 0/1 Adam synchronizes full replicas "
                         "(plain data parallelism) and, as in DeepSpeed, does not work with FSDP/ZeRO sharding")
    if p.dtype != torch.float32:
        raise ValueError(f"parameter {index} has dtype {p.dtype}; ZeroOneAdam needs float32 parameters (mixed "
                         "precision keeps fp32 master weights, e.g. Composer's amp_bf16)")
    if p.device != first.device:
        raise ValueError(f"parameter {index} is on {p.device} but parameter 0 is on {first.device}; all "
                         "parameters must be on one device")
