"""The ``two_level`` gradient scheme's options and the presets built on it (no process group: the collective
itself is tested in tests/comm/test_two_level.py, the scheme in training in tests/fsdp2/test_topology_training.py)."""

from __future__ import annotations

import copy

import pytest

from composer_qsdp.config import from_preset
from composer_qsdp.quant import make_codec
from composer_qsdp.registry import GRAD_SCHEMES
from composer_qsdp.schemes import TwoLevelReduceScatter, build_scheme, make_grad_scheme


def test_registered_with_its_codecs():
    assert GRAD_SCHEMES.lookup("two_level") is TwoLevelReduceScatter
    assert GRAD_SCHEMES.names() == ("flat", "two_level", "loco", "two_level_loco")
    side = make_codec("symmetric", bits=4, bucket_size=128)
    same = make_grad_scheme("two_level", side)
    assert same.intra_codec is side and same.codec is side and same.rotation_block is None  # qgZ: one codec
    unquantized = make_grad_scheme("two_level", side, intra_codec=None)
    assert unquantized.intra_codec is None
    tlq = make_grad_scheme("two_level", side, intra_codec={"name": "symmetric", "bits": 8, "bucket_size": 128},
                           rotation_block=32)  # fmt: skip
    assert (tlq.intra_codec.name, tlq.intra_codec.bits, tlq.intra_codec.bucket_size) == ("symmetric", 8, 128)
    assert tlq.describe() == ("two-level: intra SymmetricCodec(bits=8, bucket_size=128) | inter "
                              "SymmetricCodec(bits=4, bucket_size=128), Hadamard 32")  # fmt: skip
    copied = copy.deepcopy(tlq)  # QSDPConfig gives every unit a deep copy of a prototype
    assert copied.intra_codec is not tlq.intra_codec and repr(copied.intra_codec) == repr(tlq.intra_codec)


@pytest.mark.parametrize("options,message", [
    ({"intra_codec": "symmetric"}, r"intra_codec='symmetric' is invalid; allowed: 'same' .*None .*codec's name"),
    ({"intra_codec": {"bits": 8}}, r"intra_codec=\{'bits': 8\} is invalid"),
    ({"intra_codec": {"name": "symmetric", "bits": 9}}, r"intra_codec=.*bits=9 is not supported"),
    ({"intra_codec": {"name": "zip"}}, r"unknown codec 'zip'"),
    ({"rotation_block": 48}, r"rotation_block=48 is invalid; allowed: a power of two"),
    ({"rotation_block": True}, r"rotation_block=True is invalid"),
    ({"hops": 3}, r"invalid option for the grad scheme 'two_level'"),
])
def test_bad_options_are_value_errors(options, message):
    with pytest.raises(ValueError, match=message):
        make_grad_scheme("two_level", None, **options)


@pytest.mark.filterwarnings("ignore::composer_qsdp.config.LowBitGradientWarning")  # INT2 across nodes, on purpose
def test_presets_carry_the_papers_settings():
    zeropp = from_preset("zeropp")
    weights, grads = build_scheme("weights", zeropp.weights, 8), build_scheme("grads", zeropp.grads, 4)
    assert (weights.name, weights.codec.name, weights.codec.bits, weights.codec.bucket_size) == (
        "direct", "symmetric", 8, 4096)  # qwZ: INT8 blocks
    assert isinstance(grads, TwoLevelReduceScatter) and grads.intra_codec is grads.codec  # qgZ: INT4 both hops
    assert (grads.codec.name, grads.codec.bits, grads.codec.bucket_size, grads.rotation_block) == (
        "symmetric", 4, 2048, None)
    tlq = build_scheme("grads", from_preset("tlq-hs").grads, 4)
    assert (tlq.intra_codec.bits, tlq.codec.bits) == (8, 4)  # TLq: INT8 within nodes, INT4 across
    assert tlq.intra_codec.bucket_size == tlq.codec.bucket_size == 128
    assert tlq.rotation_block == 32 and tlq.codec.name == tlq.intra_codec.name == "symmetric"
    # flat options still change one field: INT2 across nodes, the preset's intra hop kept
    assert build_scheme("grads", from_preset("tlq-hs", grad_bits=2).grads, 2).intra_codec.bits == 8
