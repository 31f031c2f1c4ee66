"""mix_seed: deterministic, order-sensitive, in the codec's seed range, and strict about its input."""

import pytest

from composer_qsdp.comm import mix_seed


def test_keys_are_deterministic_distinct_and_in_codec_range():
    keys = {mix_seed(base, step, unit, side, rank)
            for base in (0, 7) for step in range(20) for unit in range(5) for side in (0, 1) for rank in range(4)}
    assert len(keys) == 2 * 20 * 5 * 2 * 4  # no collisions among neighbouring tuples
    assert all(0 <= k < 2**63 for k in keys)
    assert mix_seed(3, 4) == mix_seed(3, 4)
    assert mix_seed(3, 4) != mix_seed(4, 3)
    assert mix_seed(2**64 - 1) != mix_seed(0)


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, True, "3"])
def test_rejects_parts_outside_unsigned_64_bit(bad):
    with pytest.raises(ValueError, match="seed part"):
        mix_seed(1, bad)
