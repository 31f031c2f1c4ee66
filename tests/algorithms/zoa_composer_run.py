"""A real Composer DDP run with 0/1 Adam, for ``composer -n 2`` (driven by test_zero_one_adam_composer.py).

    composer -n 2 tests/algorithms/zoa_composer_run.py OUT.json [full | save CKPT_DIR | resume CKPT_DIR | freeze]

Trains composer_run.py's MLP towards its linear teacher on CPU (gloo) or GPUs (``QSDP_TEST_DEVICE=gpu``) with
Composer's ``DecoupledAdamW`` turned into 0/1 Adam by ``ZeroOneAdamDDP``: steps 1, 2, 4, 6 update the variance,
steps 3 and 5 synchronize with 1 bit, and after the variance froze the local-step phase synchronizes at steps 7, 8,
10 and 14 (intervals 1, 1, 2, 4). ``full`` first checks that ``ddp_sync_strategy='forced_sync'`` is refused, then
trains 14 batches; ``save`` trains 14 batches with a checkpoint after batch 12 (two local steps after a
synchronization: the ranks' weights differ); ``resume`` loads it and trains batches 13 and 14; ``freeze`` trains 3
epochs (48 batches) with Composer's ``LayerFreezing``, which freezes ``l1`` at the end of epoch 2. ``ZOA_OPTIONS``
(JSON) adds options of ZeroOneAdamDDP (e.g. ``{"variance_codec": "symmetric"}``). Rank 0 writes JSON:
the losses, every rank's parameters after each batch and the names of the frozen ones, the traffic report, the
optimizer's type and the logged metrics.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch
from composer import Trainer
from composer.core import Callback
from composer.algorithms import GradientClipping, LayerFreezing
from composer.loggers import InMemoryLogger
from composer.optim import DecoupledAdamW
from composer.utils import dist
from composer_run import BS, LossRecorder, Model, dataset  # noqa: I001 (this directory, on the script's path)
from torch.utils.data import DataLoader

from composer_qsdp.algorithms.zero_one_adam import ZeroOneAdamDDP
from composer_qsdp.comm import destroy_process_groups
from composer_qsdp.shared_gpu import this_process_gpu

# Durations: resolved against max_duration (14 batches) at FIT_START to var_freeze_step 6, local_step_scaler 2.
SCHEDULE = {"var_freeze_step": "6ba", "var_update_scaler": 2, "local_step_scaler": "0.143dur", "local_step_clipper": 4,
            "bucket_size": 64}
CLIP = 1e3  # GradientClipping's threshold, moved into the optimizer (never reached: the trajectory is unclipped)
BATCHES, CHECKPOINT = 14, 12


class ParamRecorder(Callback):
    """Every rank's flat parameters after each batch (all-gathered, so rank 0 can write them)."""

    def __init__(self) -> None:
        self.params: list[list[list[float]]] = []
        self.frozen: list[list[str]] = []

    def batch_end(self, state, logger) -> None:
        flat = torch.cat([p.detach().reshape(-1) for p in state.model.parameters()])
        self.params.append([t.cpu().tolist() for t in dist.all_gather(flat)])
        self.frozen.append([name for name, p in state.model.named_parameters() if not p.requires_grad])


def _trainer(mode: str, ckpt_dir: str, callbacks: list, **extra) -> tuple[Trainer, ZeroOneAdamDDP]:
    model = Model()
    ds = dataset()
    loader = DataLoader(ds, batch_size=BS, sampler=dist.get_sampler(ds, shuffle=False, drop_last=True))
    algorithm = ZeroOneAdamDDP(**SCHEDULE, **json.loads(os.environ.get("ZOA_OPTIONS", "{}")))
    checkpointing = {}
    if mode == "save":
        checkpointing = {"save_folder": ckpt_dir, "save_interval": f"{CHECKPOINT}ba", "save_overwrite": True}
    elif mode == "resume":
        # Composer writes one file (rank 0's) for DDP, and every rank loads it.
        checkpointing = {"load_path": os.path.join(ckpt_dir, f"ep0-ba{CHECKPOINT}-rank0.pt")}
    trainer = Trainer(
        model=model,
        optimizers=DecoupledAdamW(model.parameters(), lr=0.01, betas=(0.9, 0.95), weight_decay=1e-4),
        train_dataloader=loader,
        device=this_process_gpu()[0] if os.environ.get("QSDP_TEST_DEVICE") == "gpu" else "cpu",
        precision="fp32",
        algorithms=[algorithm, GradientClipping("norm", CLIP),
                    *([LayerFreezing(freeze_start=0.0, freeze_level=1.0)] if mode == "freeze" else [])],
        callbacks=callbacks,
        progress_bar=False,
        log_to_console=False,
        seed=0,
        **checkpointing,
        **{"max_duration": f"{BATCHES}ba", **extra},
    )
    return trainer, algorithm


def _forced_sync_error() -> str:
    trainer, _ = _trainer("full", "", [], ddp_sync_strategy="forced_sync", max_duration="1ba")
    try:
        trainer.fit()
    except RuntimeError as err:
        return str(err)
    finally:
        trainer.close()
    return ""


def main(out_path: str, mode: str = "full", ckpt_dir: str = "") -> None:
    forced = _forced_sync_error() if mode == "full" else None
    recorder, params, memory = LossRecorder(), ParamRecorder(), InMemoryLogger()
    extra = {"max_duration": "3ep"} if mode == "freeze" else {}
    trainer, algorithm = _trainer(mode, ckpt_dir, [recorder, params], loggers=[memory], **extra)
    trainer.fit()
    if dist.get_global_rank() == 0:
        traffic = algorithm.traffic()
        result = {
            "world_size": dist.get_world_size(),
            "model": type(trainer.state.model).__name__,
            "optimizer": type(trainer.state.optimizers[0]).__name__,
            "schedule": dataclasses.asdict(algorithm.optimizer.schedule),
            "max_grad_norm": algorithm.optimizer.max_grad_norm,
            "algorithms": [type(a).__name__ for a in trainer.state.algorithms],
            "losses": recorder.losses,
            "params": params.params,
            "frozen": params.frozen,
            "traffic": dataclasses.asdict(traffic.grads),
            "metrics": {name: [float(v) for _, v in series] for name, series in memory.data.items()
                        if name.startswith("zero_one_adam/")},
            "forced_sync_error": forced,
            "batches": int(trainer.state.timestamp.batch),
        }
        with open(out_path, "w") as f:
            json.dump(result, f)
    trainer.close()
    destroy_process_groups()  # left to exit, gloo's workers can abort the process


if __name__ == "__main__":
    main(*sys.argv[1:])
