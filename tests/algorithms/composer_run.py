"""A real Composer FSDP run with the QSDP algorithm, for ``composer -n 2`` (driven by test_qsdp_composer.py).

    FSDP_VERSION=2 composer -n 2 tests/algorithms/composer_run.py OUT.json [save CKPT_DIR | resume CKPT_DIR]

``FSDP_VERSION=1`` runs Composer's FSDP1 instead (GPUs only: Composer wraps FSDP1 on the current CUDA device).

Trains an MLP towards a fixed linear teacher on CPU (gloo) or GPUs (``QSDP_TEST_DEVICE=gpu``), then rank 0
writes JSON: the losses, the trained parameters' relative distance to an exact single-process reference, the
algorithm's traffic report and the metrics QSDP logged. ``save`` checkpoints at batch 3 of 6 (full run);
``resume`` loads that checkpoint and trains batches 4-6. ``diverge`` trains at a learning rate of 1e30 and
checkpoints every batch (QSDP must refuse the first checkpoint of non-finite weights). ``QSDP_TEST_OPTIONS`` (JSON) replaces the algorithm's
keyword arguments (default: W8G8, buckets of 256, errors sampled every 2 calls); ``QSDP_TEST_FSDP`` (JSON) adds FSDP
settings (e.g. ``{"reshard_after_forward": 2}``); ``QSDP_TEST_MICROBATCH`` splits each rank's batch of 16 into
microbatches of that many samples (gradient accumulation: one reduce-scatter per microbatch);
``QSDP_TEST_EVAL`` evaluates every that many batches on 2 batches of the training set; ``QSDP_TEST_EMA`` adds
Composer's EMA algorithm with that half-life (e.g. ``"2ba"``), which swaps its averaged weights into the model in
place for each evaluation. ``QSDP_TEST_FREEZE=1`` trains 3 epochs (48 batches) with Composer's ``LayerFreezing``,
which freezes ``l1`` at the end of epoch 2, and makes ``l3`` the only unit below the root, so that ``l1`` freezes
inside the root's unit (``l2`` trains on there); rank 0 then also writes the frozen parameters' names and whether
``l1`` moved, after each batch. ``QSDP_TEST_PREDICT=1`` runs ``Trainer.predict`` twice over 64 samples after
training and writes the largest difference of the predictions from each other and from the trained weights'
outputs computed by a plain single-process copy of the network. ``QSDP_TEST_COMPILE=1`` passes Composer's
``compile_config={}`` (``torch.compile`` of the whole model); rank 0 then also writes how many graphs dynamo compiled.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch
import torch.nn as nn
from composer import Trainer
from composer.algorithms import EMA, LayerFreezing
from composer.core import Callback
from composer.loggers import InMemoryLogger
from composer.models import ComposerModel
from composer.utils import dist
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanSquaredError

from composer_qsdp import QSDP, QSDPConfig
from composer_qsdp.comm import destroy_process_groups
from composer_qsdp.shared_gpu import this_process_gpu

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for its helpers
from full_dtensor import gather_full  # noqa: E402

N, BS, IN, HID, OUT, LR = 512, 16, 32, 128, 16, 0.05
DEFAULT_OPTIONS = {"weight_bits": 8, "grad_bits": 8, "bucket_size": 256, "error_sample_interval": 2}
FREEZE = os.environ.get("QSDP_TEST_FREEZE") == "1"
COMPILE = os.environ.get("QSDP_TEST_COMPILE") == "1"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(IN, HID), nn.Linear(HID, 67), nn.Linear(67, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))

    def fsdp_wrap_fn(self, module: nn.Module) -> bool:  # Composer's wrapping hook: each Linear is a unit
        return isinstance(module, nn.Linear) and (not FREEZE or module is self.l3)


class Model(ComposerModel):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1234)
        self.net = Net()
        for layer in (self.net.l1, self.net.l2, self.net.l3):  # He init: a signal that learns in a few steps
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")

    def forward(self, batch):
        return self.net(batch[0])

    def loss(self, outputs, batch):
        return nn.functional.mse_loss(outputs.float(), batch[1])

    def get_metrics(self, is_train: bool = False):
        return {} if is_train else {"MeanSquaredError": MeanSquaredError()}

    def update_metric(self, batch, outputs, metric) -> None:
        metric.update(outputs.float(), batch[1])


class LossRecorder(Callback):
    """The global mean loss of every batch (Composer's ``state.loss`` is this rank's)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def after_train_batch(self, state, logger) -> None:
        loss = state.loss.detach().clone()
        dist.all_reduce(loss)
        self.losses.append(loss.item() / dist.get_world_size())


class FreezeRecorder(Callback):
    """After each batch: the names of the frozen parameters, and whether ``l1``'s weight moved in the batch."""

    def __init__(self) -> None:
        self.frozen: list[list[str]] = []
        self.l1_moved: list[bool] = []
        self._last: torch.Tensor | None = None

    def batch_end(self, state, logger) -> None:
        net = state.model.net
        self.frozen.append([name for name, p in net.named_parameters() if not p.requires_grad])
        now = gather_full(net.l1.weight).cpu()
        self.l1_moved.append(self._last is None or not torch.equal(now, self._last))
        self._last = now


def dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, IN, generator=gen)
    teacher = torch.randn(OUT, IN, generator=gen) / IN**0.5
    return TensorDataset(x, x @ teacher.T)


def reference(batches: int, world: int) -> dict[str, torch.Tensor]:
    """Exact single-process SGD on the global batches the DistributedSampler (no shuffle) hands out."""
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x_all, y_all = dataset().tensors
    for b in range(batches):
        # Rank r's b-th batch holds samples r, r + W, r + 2W, ... of the global block of W * BS samples.
        block = slice(b * world * BS, (b + 1) * world * BS)
        x, y = x_all[block], y_all[block]
        model.loss(model.net(x), (x, y)).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach() for n, p in model.net.named_parameters()}


def full_params(state) -> dict[str, torch.Tensor]:
    """The trained parameters, unsharded, on the CPU (FSDP1: ``summon_full_params``, which QSDP leaves exact; FSDP2:
    :func:`full_dtensor.gather_full`, as ``full_tensor()`` segfaults on CUDA tensors over gloo, pytorch#152645)."""
    net = state.model.net
    if state.fsdp_config_version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(net, writeback=False):
            return {n: p.detach().cpu().clone() for n, p in net.named_parameters()}
    return {n: gather_full(p).cpu() for n, p in net.named_parameters()}


def _predictions(trainer: Trainer) -> dict[str, float]:
    """Two ``Trainer.predict`` calls over the first 64 samples against the trained weights' outputs from a plain
    single-process copy of the network (each rank checks the samples its sampler gives it; the maxima over ranks)."""
    samples = torch.utils.data.Subset(dataset(), range(64))
    sampler = dist.get_sampler(samples, shuffle=False)
    loader = DataLoader(samples, batch_size=BS, sampler=sampler)
    first, second = (torch.cat([o.detach().cpu() for o in trainer.predict(loader, return_outputs=True)])
                     for _ in range(2))
    plain = Net()
    plain.load_state_dict(full_params(trainer.state))
    with torch.no_grad():
        expected = plain(samples.dataset.tensors[0][list(sampler)])
    gaps = torch.stack([(first - expected).abs().max(), (second - first).abs().max()])
    dist.all_reduce(gaps, reduce_operation="MAX")
    return {"vs_trained_weights": gaps[0].item(), "between_calls": gaps[1].item()}


def _compiled_graphs() -> int:
    """The graphs dynamo compiled in this process (FSDP2's hooks, and with them QSDP's collectives, run eagerly
    between them: torch skips FSDP hooks by default)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def main(out_path: str, mode: str = "full", ckpt_dir: str = "") -> None:
    # On GPUs, ranks share them over gloo where there are fewer GPUs than ranks (composer_qsdp.shared_gpu).
    device = this_process_gpu()[0] if os.environ.get("QSDP_TEST_DEVICE") == "gpu" else "cpu"
    model = Model()
    ds = dataset()
    loader = DataLoader(ds, batch_size=BS, sampler=dist.get_sampler(ds, shuffle=False, drop_last=True))
    options = dict(json.loads(os.environ.get("QSDP_TEST_OPTIONS", "null")) or DEFAULT_OPTIONS)
    qsdp = QSDP(QSDPConfig.from_preset(options.pop("preset", "w8g8"), **options))
    fsdp_settings = json.loads(os.environ.get("QSDP_TEST_FSDP", "null")) or {}
    recorder, freezing = LossRecorder(), FreezeRecorder()
    memory = InMemoryLogger()
    checkpointing = {}
    lr = 1e30 if mode == "diverge" else LR
    if mode == "diverge":
        checkpointing = {"save_folder": ckpt_dir, "save_interval": "1ba", "save_overwrite": True}
    elif mode == "save":
        checkpointing = {"save_folder": ckpt_dir, "save_interval": "3ba", "save_overwrite": True}
    elif mode == "resume":
        checkpointing = {"load_path": os.path.join(ckpt_dir, "ep0-ba3")}
    every = int(os.environ.get("QSDP_TEST_EVAL", 0))
    if every:
        checkpointing.update(eval_dataloader=DataLoader(ds, batch_size=BS, sampler=dist.get_sampler(ds, shuffle=False)),
                             eval_interval=f"{every}ba", eval_subset_num_batches=2)
    trainer = Trainer(
        model=model,
        optimizers=torch.optim.SGD(model.parameters(), lr=lr),
        train_dataloader=loader,
        max_duration="3ep" if FREEZE else "6ba" if mode != "full" else "16ba",
        device=device,
        precision="fp32",
        parallelism_config={"fsdp": {"mixed_precision": "FULL", "state_dict_type": "sharded", **fsdp_settings}},
        algorithms=[qsdp, *([EMA(half_life=ema)] if (ema := os.environ.get("QSDP_TEST_EMA")) else []),
                    *([LayerFreezing(freeze_start=0.0, freeze_level=1.0)] if FREEZE else [])],
        callbacks=[recorder, *([freezing] if FREEZE else [])],
        loggers=[memory],
        progress_bar=False,
        log_to_console=False,
        seed=0,
        device_train_microbatch_size=int(os.environ.get("QSDP_TEST_MICROBATCH", BS)),
        compile_config={} if COMPILE else None,
        **checkpointing,
    )
    trainer.fit()
    predictions = _predictions(trainer) if os.environ.get("QSDP_TEST_PREDICT") == "1" else None
    params = full_params(trainer.state)
    batches = int(trainer.state.timestamp.batch)
    if dist.get_global_rank() == 0:
        ref = reference(batches, dist.get_world_size())
        rel = {n: ((params[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref}
        metrics = {name: [float(v) for _, v in series] for name, series in memory.data.items()
                   if name.startswith("qsdp/")}
        traffic = qsdp.traffic()
        result = {
            "fsdp_version": trainer.state.fsdp_config_version,
            "adapter": qsdp.handle.adapter if qsdp.handle is not None else None,
            "world_size": dist.get_world_size(),
            "losses": recorder.losses,
            "param_rel_error": rel,
            "traffic": {side: dataclasses.asdict(getattr(traffic, side)) for side in ("weights", "grads")},
            "eval_traffic": {side: dataclasses.asdict(getattr(qsdp.eval_traffic(), side)) for side in ("weights", "grads")},
            "metrics": metrics,
            "eval_mse": [float(v) for _, v in memory.data.get("metrics/eval/MeanSquaredError", [])],
            "seeds": qsdp.handle.seeds.state_dict() if qsdp.handle is not None else None,
            "keyframes": [getattr(u.weights, "keyframes", None) for u in qsdp.handle.units] if qsdp.handle else None,
            "batches": batches,
            "hyperparameters": {k: v for k, v in memory.hyperparameters.items() if k.startswith("qsdp/")},
            "auto_current": qsdp.auto.current if qsdp.auto is not None else None,
            "frozen": freezing.frozen,
            "predictions": predictions,
            "l1_moved": freezing.l1_moved,
            "compiled_graphs": _compiled_graphs() if COMPILE else None,
        }
        with open(out_path, "w") as f:
            json.dump(result, f)
    trainer.close()
    destroy_process_groups()  # left to exit, gloo's workers can abort the process


if __name__ == "__main__":
    main(*sys.argv[1:])
