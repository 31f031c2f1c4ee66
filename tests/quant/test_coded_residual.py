"""CodedResidual: an error-feedback residual stored as a codec's wire, and the codecs' feedback reference with it."""

import pytest
import torch

from composer_qsdp.kernels import backend
from composer_qsdp.quant import CodedResidual, HadamardCodec, MinMaxCodec, SymmetricCodec


def _values(rows: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scales = torch.exp(2 * torch.randn(rows, n // 8 + 1, generator=g)).repeat_interleave(8, dim=1)[:, :n]
    return torch.randn(rows, n, generator=g) * scales


def test_a_coded_residual_stores_each_bucket_to_half_a_step():
    """Stored values come back within half a level of their bucket's abs-max / 127, zero stays exactly zero, and the
    wire is the symmetric codec's own encode (what the fused kernels must write)."""
    rows, n, bucket = 3, 1000, 256
    codec = SymmetricCodec(8, bucket)
    residual = CodedResidual(codec, rows, n)
    assert torch.equal(residual.decode(), torch.zeros(rows, n))
    assert residual.nbytes == rows * codec.wire_bytes(n) < rows * n * 1.02
    values = _values(rows, n, seed=1)
    residual.store(values)
    assert torch.equal(residual.wire, codec.encode_rows(values))
    padded = torch.nn.functional.pad(values.abs(), (0, -n % bucket)).view(rows, -1, bucket)
    step = (padded.amax(dim=2) / 127).repeat_interleave(bucket, dim=1)[:, :n]
    assert bool(((residual.decode() - values).abs() <= step / 2 * (1 + 1e-6)).all())
    assert torch.equal(residual.zero_().decode(), torch.zeros(rows, n))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("bucket", [7, 256])
@pytest.mark.parametrize("n", [1, 5, 255, 256, 257, 1000])
def test_the_zero_wire_is_the_encode_of_zeros(bits, bucket, n):
    """The symmetric codec's wire of zeros, built from one bucket's, is its encode of a zero tensor byte for byte
    (whole and partial last buckets, codes of every width, odd bucket sizes), as the base codec's default is."""
    codec = SymmetricCodec(bits, bucket)
    for rows in (1, 3):
        expected = codec.encode_rows(torch.zeros(rows, n))
        assert torch.equal(codec.encode_zero_rows(rows, n), expected)
        assert torch.equal(CodedResidual(codec, rows, n).wire, expected)
    minmax = MinMaxCodec(bits, bucket, rounding="nearest")
    assert torch.equal(minmax.encode_zero_rows(2, n), minmax.encode_rows(torch.zeros(2, n)))


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n", [1, 255, 4096 + 3])
def test_the_cuda_zero_wire_is_the_kernel_encode_of_zeros(bits, n):
    """On CUDA the zero wire (a fresh or resumed LoCo residual's) is what the Triton encode writes for zeros, and the
    CPU wire: the fused feedback kernels read it as a residual of zeros."""
    codec = SymmetricCodec(bits, 256)
    zeros = torch.zeros(3, n, device="cuda")
    wire = CodedResidual(codec, 3, n, device="cuda").wire
    assert wire.device.type == "cuda"
    assert torch.equal(wire, codec.encode_rows(zeros))
    assert torch.equal(wire.cpu(), codec.encode_rows(zeros.cpu()))
    assert torch.equal(codec.decode_rows(wire, n), zeros)


def test_a_coded_residual_rejects_misuse():
    with pytest.raises(ValueError, match="rounds to nearest"):
        CodedResidual(MinMaxCodec(8, 256, rounding="stochastic"), 2, 10)
    with pytest.raises(ValueError, match="rows=0"):
        CodedResidual(SymmetricCodec(8, 256), 0, 10)
    residual = CodedResidual(SymmetricCodec(8, 256), 2, 10)
    with pytest.raises(ValueError, match=r"shape \(2, 10\) cannot store a tensor of shape \(2, 11\)"):
        residual.store(torch.zeros(2, 11))
    codec = MinMaxCodec(3, 64, rounding="nearest")
    with pytest.raises(ValueError, match=r"decode to the input's shape \(2, 11\)"):
        codec.encode_rows_feedback(torch.zeros(2, 11), residual, 0.5)


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("bits", [2, 3])
def test_feedback_with_a_coded_residual_is_the_float_recursion_stored_once(rotate, bits):
    """Each call sends the encode of ``x + decode(residual)`` and stores the float recursion's new residual rounded
    once to the residual codec: the same wire and residual as an fp32 residual started from the decoded one, then
    encoded. Over calls the coded residual tracks the fp32 one to within the storage error."""
    rows, n, bucket = 4, 700, 256
    inner = MinMaxCodec(bits, bucket, rounding="nearest")
    codec = HadamardCodec(inner) if rotate else inner
    storage = SymmetricCodec(8, bucket)
    coded = CodedResidual(storage, rows, n)
    with backend("torch"):
        for step in range(4):
            x = _values(rows, n, seed=10 + step)
            as_float = coded.decode().reshape(-1).clone()
            expected = codec.encode_rows_feedback(x, as_float, 0.5, seed=3, offset=5)
            got = codec.encode_rows_feedback(x, coded, 0.5, seed=3, offset=5)
            assert torch.equal(got, expected)
            assert torch.equal(coded.wire, storage.encode_rows(as_float.view(rows, n)))


def test_a_coded_residual_keeps_non_finite_gradients_out():
    """A NaN/Inf gradient reaches the wire, but the stored residual stays finite (its entries reset to zero)."""
    rows, n = 2, 512
    codec = MinMaxCodec(3, 256, rounding="nearest")
    coded = CodedResidual(SymmetricCodec(8, 256), rows, n)
    x = _values(rows, n, seed=4)
    x[0, 3], x[1, 300] = float("nan"), float("inf")
    with backend("torch"):
        codec.encode_rows_feedback(x, coded, 0.5)
    decoded = coded.decode()
    assert bool(torch.isfinite(decoded).all())
    assert decoded[0, :256].abs().max() == 0 and decoded[1, 256:].abs().max() == 0
    assert decoded[0, 256:].abs().max() > 0
