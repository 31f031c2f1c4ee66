"""mix_seed: deterministic, order-sensitive, in the codec's seed range, and strict about its input."""

import pytest

from composer_qsdp.comm import SeedStream, StepSeeds, mix_seed


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


def test_step_seeds_follow_the_optimizer_step_and_the_microbatch():
    seeds = StepSeeds(7)
    assert seeds.seed(0, SeedStream.WEIGHTS) == mix_seed(7, 0, 1, 0, 0)  # before the first forward: its key
    seeds.begin_microbatch()
    first = seeds.seed(0, SeedStream.WEIGHTS)
    assert seeds.seed(0, SeedStream.WEIGHTS) == first  # forward and backward re-gather of one microbatch
    assert first == mix_seed(7, 0, 1, 0, 0)
    assert len({first, seeds.seed(1, SeedStream.WEIGHTS), seeds.seed(0, SeedStream.GRADS)}) == 3
    seeds.begin_microbatch()
    second = seeds.seed(0, SeedStream.WEIGHTS)  # the next microbatch of the same step
    seeds.end_optimizer_step()
    before_forward = seeds.seed(0, SeedStream.WEIGHTS)  # a gather outside the model's forward (an evaluation)
    seeds.begin_microbatch()
    third = seeds.seed(0, SeedStream.WEIGHTS)
    assert before_forward == third == mix_seed(7, 1, 1, 0, 0)  # the key the step's first forward reads
    assert len({first, second, third}) == 3 and (seeds.optimizer_step, seeds.microbatch) == (1, 1)
    restored = StepSeeds(7)
    restored.load_state_dict(seeds.state_dict())
    assert restored.seed(0, SeedStream.WEIGHTS) == third
