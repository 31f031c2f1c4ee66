"""Hadamard pre-rotation: the bucketed normalized Walsh-Hadamard transform and the HadamardCodec wrapper."""

import pytest
import torch

from composer_qsdp.kernels import backend
from composer_qsdp.quant import (FusedRotation, HadamardCodec, MinMaxCodec, SymmetricCodec, hadamard_rows,
                                 hadamard_rows_, make_codec)


def _sylvester(order: int) -> torch.Tensor:
    """Sylvester's Hadamard matrix divided by sqrt(order), float64, built by explicit Kronecker products."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < order:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), h)
    return h / order**0.5


@pytest.mark.parametrize("bucket", (1, 2, 8, 256))
def test_rotation_is_the_normalized_sylvester_matrix_on_zero_padded_buckets(bucket):
    rows, n = 3, 3 * bucket + (1 if bucket > 1 else 0)
    x = torch.randn(rows, n)
    nb = -(-n // bucket)
    rotated = hadamard_rows(x, bucket, nb * bucket, torch.float32)
    padded = torch.nn.functional.pad(x.double(), (0, nb * bucket - n)).view(rows, nb, bucket)
    expected = (padded @ _sylvester(bucket)).view(rows, -1)
    torch.testing.assert_close(rotated.double(), expected, rtol=0, atol=1e-6)


def test_rotation_is_orthonormal_and_its_own_inverse():
    x = torch.randn(2, 1000, dtype=torch.float64).float()
    rotated = hadamard_rows(x, 128, 1024, torch.float32)
    torch.testing.assert_close(rotated.norm(dim=1), x.norm(dim=1), rtol=1e-6, atol=0)
    back = hadamard_rows(rotated, 128, 1000, torch.float32)
    torch.testing.assert_close(back, x, rtol=0, atol=1e-6)
    assert hadamard_rows(x, 128, 1000, torch.bfloat16).dtype == torch.bfloat16


def test_rotation_spreads_an_outlier_and_shrinks_the_quantization_error():
    """SDP4Bit's motivation: one outlier sets a block's scale; rotated, its energy is spread over the block."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64 * 32, generator=gen)
    x[::64] = 100.0  # one outlier per bucket of 64
    plain = SymmetricCodec(4, 64)
    rotated = make_codec("symmetric", bits=4, bucket_size=64, hadamard=True)
    err_plain = (plain.decode(plain.encode(x), x.numel()) - x).square().mean()
    err_rotated = (rotated.decode(rotated.encode(x), x.numel()) - x).square().mean()
    assert err_rotated < 0.5 * err_plain


def test_wire_is_the_inner_codecs_wire_of_the_padded_rotation():
    inner = make_codec("minmax", bits=4, bucket_size=64)
    codec = HadamardCodec(inner)
    x = torch.randn(150)
    wire = codec.encode(x, seed=3, offset=5)
    assert codec.wire_bytes(150) == inner.wire_bytes(192)
    expected = inner.encode(hadamard_rows(x.view(1, -1), 64, 192, torch.float32)[0], seed=3, offset=5)
    assert torch.equal(wire, expected)
    decoded = codec.decode(wire, 150)
    assert torch.equal(decoded, hadamard_rows(inner.decode(wire, 192).view(1, -1), 64, 150, torch.float32)[0])


def test_unbiasedness_follows_the_inner_codec():
    assert make_codec("minmax", bits=4, bucket_size=64, hadamard=True).unbiased
    assert make_codec("random_shift", bits=4, bucket_size=64, hadamard=True).unbiased
    assert not make_codec("symmetric", bits=4, bucket_size=64, hadamard=True).unbiased


def test_nan_spreads_over_its_bucket_only():
    codec = make_codec("symmetric", bits=8, bucket_size=32, hadamard=True)
    x = torch.randn(96)
    x[40] = float("nan")
    decoded = codec.decode(codec.encode(x), 96)
    assert decoded[32:64].isnan().all()
    assert torch.isfinite(decoded[:32]).all() and torch.isfinite(decoded[64:]).all()


@pytest.mark.parametrize("bucket", (100, 3, 1000))
def test_rejects_bucket_sizes_that_are_not_powers_of_two(bucket):
    with pytest.raises(ValueError, match=rf"bucket_size={bucket} cannot be Hadamard-rotated; allowed: a power of two"):
        make_codec("symmetric", bits=8, bucket_size=bucket, hadamard=True)


def test_rejects_what_is_not_a_codec_and_bad_output_columns():
    with pytest.raises(ValueError, match="wraps a Codec"):
        HadamardCodec("symmetric")
    with pytest.raises(ValueError, match="out_cols=200 is invalid; allowed: 1..128"):
        hadamard_rows(torch.randn(1, 100), 64, 200, torch.float32)


@pytest.mark.parametrize("bucket", (1, 32, 256))
def test_in_place_rotation_is_the_rotation_written_over_its_input(bucket):
    x = torch.randn(3, 4 * bucket, generator=torch.Generator().manual_seed(bucket))
    expected = hadamard_rows(x, bucket, x.shape[1], torch.float32)
    storage = x.data_ptr()
    with backend("torch"):
        assert hadamard_rows_(x, bucket) is x
    assert x.data_ptr() == storage and torch.equal(x, expected)


@pytest.mark.parametrize("shape,dtype,why", [((2, 64), torch.bfloat16, "bfloat16"), ((2, 48), torch.float32, "(2, 48)"),
                                             ((64,), torch.float32, "(64,)")])  # fmt: skip
def test_in_place_rotation_names_what_it_cannot_rotate(shape, dtype, why):
    x = torch.zeros(shape, dtype=dtype)
    with pytest.raises(ValueError, match=rf"cannot rotate .*{why}.* allowed: float32 \[R, n\]"):
        hadamard_rows_(x, 32)
    assert not x.any()


class _RecordingMinMax(MinMaxCodec):
    """A min-max codec that implements :class:`FusedRotation` by delegating to the two-pass composition (or, with
    ``declines``, by returning None) and records the calls, as a third-party codec with fused kernels would."""

    def __init__(self, declines: bool) -> None:
        super().__init__(bits=4, bucket_size=64)
        self.declines, self.calls = declines, []

    def _two_pass(self) -> HadamardCodec:
        return HadamardCodec(MinMaxCodec(bits=4, bucket_size=64))

    def encode_rows_rotated(self, x, seed, offset):
        self.calls.append("encode_rows_rotated")
        return None if self.declines else self._two_pass().encode_rows(x, seed, offset)

    def decode_rows_rotated(self, wire, numel, dtype):
        self.calls.append("decode_rows_rotated")
        return None if self.declines else self._two_pass().decode_rows(wire, numel, dtype)

    def decode_sum_rotated(self, wire, numel, out=None, divisor=1):
        self.calls.append("decode_sum_rotated" if out is None else "decode_sum_rotated into out")
        if self.declines:
            return None
        if out is None:
            return self._two_pass().decode_sum(wire, numel, divisor=divisor)
        return self._two_pass().decode_sum(wire, numel, out=out, divisor=divisor)


def test_fused_rotation_is_discovered_by_protocol_and_none_falls_back_to_two_passes():
    # Min-max fuses the encode and the decode-sum, on its kernels: on CPU tensors every fused method declines.
    assert isinstance(SymmetricCodec(4, 64), FusedRotation) and isinstance(MinMaxCodec(4, 64), FusedRotation)
    x = torch.randn(3, 150)
    reference = HadamardCodec(MinMaxCodec(bits=4, bucket_size=64))  # two passes: its fused methods decline
    wire = reference.encode_rows(x, seed=5, offset=2)
    expected = (wire, reference.decode_rows(wire, 150, torch.bfloat16), reference.decode_sum(wire, 150),
                reference.decode_sum(wire, 150, out=torch.empty(150, dtype=torch.bfloat16), divisor=3))
    for declines in (False, True):
        inner = _RecordingMinMax(declines)
        codec = HadamardCodec(inner)
        out = torch.empty(150, dtype=torch.bfloat16)
        got = (codec.encode_rows(x, seed=5, offset=2), codec.decode_rows(wire, 150, torch.bfloat16),
               codec.decode_sum(wire, 150), codec.decode_sum(wire, 150, out=out, divisor=3))  # fmt: skip
        for g, e in zip(got, expected):
            assert torch.equal(g, e)
        assert got[3] is out  # a reduce-scatter's output, written in place by the fused kernel or the fallback
        # Declined, the average falls back to the fused sum, then divides and copies.
        assert inner.calls == ["encode_rows_rotated", "decode_rows_rotated", "decode_sum_rotated",
                               "decode_sum_rotated into out"] + ["decode_sum_rotated"] * declines


def test_symmetric_fused_rotation_declines_on_the_torch_backend_and_validates():
    codec = SymmetricCodec(bits=4, bucket_size=64)
    x = torch.randn(2, 100)
    wire = HadamardCodec(codec).encode_rows(x)
    with backend("torch"):
        assert codec.encode_rows_rotated(x) is None
        assert codec.decode_rows_rotated(wire, 100, torch.float32) is None
        assert codec.decode_sum_rotated(wire, 100) is None
    with pytest.raises(ValueError, match="needs exactly"):
        codec.decode_rows_rotated(wire[:, :-4], 100, torch.float32)
    with pytest.raises(ValueError, match="2-D"):
        codec.encode_rows_rotated(x[0])
