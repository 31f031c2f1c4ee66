"""RankMemory writes each rank's record after every batch: peaks (None off the GPU), QSDP's scheme memory and the
parameters each side runs on; the recipes build it by name."""

import json
from types import SimpleNamespace

import torch.nn as nn

from composer_qsdp.recipes.loader import CALLBACKS
from composer_qsdp.recipes.rank_memory import RankMemory, scheme_memory


class _Scheme:
    def __init__(self, memory: int, codec: object | None) -> None:
        self.memory, self.codec = memory, codec

    def memory_bytes(self) -> int:
        return self.memory


class _Handle:
    """Two units: one quantized on both sides (a reference of 40 bytes, a residual of 21), one unquantized; 12
    bytes of state in host memory."""

    units = [SimpleNamespace(numel=20, weights=_Scheme(40, "codec"), grads=_Scheme(21, "codec")),
             SimpleNamespace(numel=7, weights=_Scheme(0, None), grads=_Scheme(0, None))]

    def memory_bytes(self) -> int:
        return 61

    def host_memory_bytes(self) -> int:
        return 12


def test_each_batch_rewrites_the_record_of_this_rank(tmp_path):
    model = nn.Linear(4, 3)  # 15 parameters
    state = SimpleNamespace(model=model, algorithms=[SimpleNamespace(handle=_Handle()), object()],
                            timestamp=SimpleNamespace(batch=1))
    callback = RankMemory(str(tmp_path / "memory"))
    callback.batch_end(state, None)
    state.timestamp.batch = 2
    callback.batch_end(state, None)
    record = json.loads((tmp_path / "memory" / "rank_memory-rank0.json").read_text())
    assert record == {"rank": 0, "world_size": 1, "device": "cpu", "batches": 2, "peak_allocated_bytes": None,
                      "peak_reserved_bytes": None, "peak_allocated_by_batch": None, "scheme_memory_bytes": 61,
                      "scheme_host_memory_bytes": 12, "scheme_memory_by_side": {"weights": 40, "grads": 21}, "params": 15,
                      "quantized_params": {"weights": 20, "grads": 20}}
    assert not list((tmp_path / "memory").glob("*.tmp"))


def test_without_qsdp_nothing_is_kept_and_the_recipes_know_the_name():
    state = SimpleNamespace(algorithms=[SimpleNamespace(handle=None)])
    assert scheme_memory(state) == {"weights": 0, "grads": 0}
    assert CALLBACKS["rank_memory"].target == "composer_qsdp.recipes.rank_memory:RankMemory"
