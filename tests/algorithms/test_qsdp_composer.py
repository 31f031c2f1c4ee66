"""QSDP in a real Composer FSDP2 run of 2 ranks (tests/algorithms/composer_run.py); FSDP1 (Composer wraps it on CUDA
devices only) on 2 GPUs. The ranks start through ``torchrun`` (``e2e_common.torchrun``: the variables ``composer -n
2`` sets, without the launcher's own import of Composer); the GPU runs and tests/test_train.py use Composer's
launcher itself."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import e2e_common  # benchmarks/ (tests/conftest.py): the launch commands
from wire_bytes import cdiv, hadamard_minmax_bytes, symmetric_bytes  # benchmarks/: the formats' definitions

from composer_qsdp.fsdp2 import HAS_CUSTOM_COMM_API

SCRIPT = Path(__file__).with_name("composer_run.py")


# SDP4Bit's weight differences (symmetric INT4 groups, small for these layers) with 8-bit gradients.
QWD = {"weight_scheme": "difference", "weight_codec": "symmetric", "weight_bits": 4, "bucket_size": 256,
       "error_sample_interval": 2}
# The automatic policy, deciding after 2 batches; no re-decision, so a resumed run continues the same schemes.
AUTO = {"policy": "auto", "auto_options": {"warmup_steps": 2, "recheck_tolerance": 1e9}, "error_sample_interval": 2}


def _run(tmp_path: Path, out: Path, *args: str, gpu: bool = False, options: dict | None = None, nproc: int = 2,
         fsdp: dict | None = None, fsdp_version: int = 2, microbatch: int = 16,
         eval_every: int = 0, ema: str = "", freeze: bool = False,
         predict: bool = False, compile: bool = False) -> subprocess.CompletedProcess:
    launch = e2e_common.launcher if gpu else e2e_common.torchrun
    env = {**os.environ, "FSDP_VERSION": str(fsdp_version), "OMP_NUM_THREADS": "1",
           "QSDP_TEST_OPTIONS": json.dumps(options), "QSDP_TEST_FSDP": json.dumps(fsdp),
           "QSDP_TEST_MICROBATCH": str(microbatch), "QSDP_TEST_EVAL": str(eval_every),
           "QSDP_TEST_EMA": ema, "QSDP_TEST_FREEZE": "1" if freeze else "",
           "QSDP_TEST_PREDICT": "1" if predict else "", "QSDP_TEST_COMPILE": "1" if compile else ""}
    if gpu:
        env["QSDP_TEST_DEVICE"] = "gpu"
    return subprocess.run([*launch(nproc), str(SCRIPT), str(out), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)


def _launch(tmp_path: Path, *args: str, gpu: bool = False, options: dict | None = None, nproc: int = 2,
            fsdp: dict | None = None, fsdp_version: int = 2, microbatch: int = 16, eval_every: int = 0,
            ema: str = "", freeze: bool = False, predict: bool = False, compile: bool = False) -> dict:
    name = "-".join(a for a in args if "/" not in a) or "full"
    out = tmp_path / f"result-{name}{'-compiled' if compile else ''}.json"
    proc = _run(tmp_path, out, *args, gpu=gpu, options=options, nproc=nproc, fsdp=fsdp, fsdp_version=fsdp_version,
                microbatch=microbatch, eval_every=eval_every, ema=ema, freeze=freeze, predict=predict,
                compile=compile)
    assert proc.returncode == 0, f"launcher failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    return json.loads(out.read_text())


def _check_quantized_training(result: dict, fsdp_version: int = 2) -> None:
    assert result["fsdp_version"] == fsdp_version and result["world_size"] == 2
    # The algorithm picks the adapter (and FSDP2's comm path, by torch version) from the run and names it.
    expected = "fsdp1 (" if fsdp_version == 1 else "fsdp2 (custom: " if HAS_CUSTOM_COMM_API else "fsdp2 (proxy: "
    assert result["adapter"].startswith(expected), result["adapter"]
    weights, grads = result["traffic"]["weights"], result["traffic"]["grads"]
    batches = len(result["losses"])
    assert weights["calls"] == 2 * 3 * batches and grads["calls"] == 3 * batches  # 3 units, fwd+bwd gathers
    for side in (weights, grads):  # fp32 ('FULL') collectives replaced by 8-bit codes + bucket metadata
        assert side["sent"] < side["bf16"] < side["native"]
    metrics = result["metrics"]
    assert len(metrics["qsdp/weights/bytes_sent"]) == batches
    assert sum(metrics["qsdp/weights/bytes_sent"]) == weights["sent"]
    assert all(1.9 < r < 2 for r in metrics["qsdp/compression_vs_bf16"])
    assert all(0 < e < 0.05 for e in metrics["qsdp/weights/rel_error"] + metrics["qsdp/grads/rel_error"])
    # Composer's optimizer steps are QSDP's step boundary: one per batch, each closing its microbatches.
    assert result["seeds"] == {"optimizer_step": result["batches"], "microbatch": 0}
    losses = result["losses"]
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:2]) / 2, losses
    assert max(result["param_rel_error"].values()) < 2e-2, result["param_rel_error"]


@pytest.mark.slow  # the recipe entrypoint's launcher run (tests/test_train.py) trains QSDP the same way
def test_composer_launcher_run_quantizes_fsdp_traffic(tmp_path):
    _check_quantized_training(_launch(tmp_path))


@pytest.mark.parametrize("preset", ["w8g8", "qwd-w3g3-loco"])
def test_trainer_predict_computes_with_the_trained_weights(tmp_path, preset):
    """Trainer.predict after training gathers the exact weights, as an evaluation does: its outputs are a plain
    copy of the trained network's, and two calls agree (stochastically rounded 8-bit weights differed by 0.12)."""
    result = _launch(tmp_path, options={"preset": preset}, predict=True)
    assert result["predictions"]["between_calls"] == 0
    assert result["predictions"]["vs_trained_weights"] < 1e-5, result["predictions"]


@pytest.mark.slow  # the LoCo preset's launcher run below gathers weight differences through Composer too
def test_composer_run_with_weight_differences(tmp_path):
    result = _launch(tmp_path, options=QWD)
    weights = result["traffic"]["weights"]
    batches = len(result["losses"])
    assert result["keyframes"] == [1, 1, 1]  # one full-precision gather per unit, at the first step
    assert weights["calls"] == 2 * 3 * batches and weights["sent"] < weights["native"] / 4  # 4-bit, once a step
    # The backward re-gathers come from the reference: no collective, so in neither the bytes nor the baselines.
    assert weights["served_locally"] == 3 * batches and weights["native"] == 2 * weights["bf16"]
    assert weights["served_native"] == weights["native"]  # plain FSDP sends each re-gather's bytes again
    assert all(0 < e < 0.05 for e in result["metrics"]["qsdp/weights/rel_error"])
    losses = result["losses"]
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:2]) / 2, losses
    assert max(result["param_rel_error"].values()) < 2e-2, result["param_rel_error"]


def test_a_compiled_model_trains_as_the_eager_one(tmp_path):
    """Composer's ``compile_config`` (``torch.compile`` of the whole model) under a LoCo preset with weight
    differences: dynamo compiles the layers between FSDP2's hooks and QSDP's collectives keep running in them, so
    the run sends the same bytes and trains to the eager run's losses (fp32 on CPU: inductor's kernels may order a
    reduction differently, so to 1e-5)."""
    options = {"preset": "qwd-w3g3-loco"}
    eager = _launch(tmp_path, options=options)
    compiled = _launch(tmp_path, options=options, compile=True)
    assert compiled["compiled_graphs"] >= 1
    assert compiled["traffic"] == eager["traffic"]
    assert compiled["keyframes"] == eager["keyframes"] == [1, 1, 1]
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-5)
    assert max(compiled["param_rel_error"].values()) < 2e-2, compiled["param_rel_error"]


def test_updates_sent_ahead_train_as_without_them_in_a_composer_run(tmp_path):
    """speculative_update through Composer (two microbatches a step, an evaluation every 4 batches, no clipping):
    the same losses and bytes as without it, every step after the first guessed and every guess a hit."""
    options = {"preset": "qwd-w4g2-loco"}
    plain = _launch(tmp_path, options=options, microbatch=8, eval_every=4)
    ahead = _launch(tmp_path, options={**options, "speculative_update": True}, microbatch=8, eval_every=4)
    assert ahead["losses"] == plain["losses"]
    assert ahead["traffic"] == plain["traffic"]
    metrics, units, batches = ahead["metrics"], len(ahead["keyframes"]), ahead["batches"]
    assert metrics["qsdp/speculation/sent"][-1] == metrics["qsdp/speculation/hits"][-1] == units * (batches - 1)
    assert metrics["qsdp/speculation/misses"][-1] == metrics["qsdp/speculation/paused"][-1] == 0


@pytest.mark.parametrize("preset,weight_bits,grad_bits", [
    ("qwd-w4g2-loco", 4, 2), pytest.param("qwd-w3g2-loco", 3, 2, marks=pytest.mark.slow)])
def test_loco_preset_bytes_with_gradient_accumulation_and_evaluation(tmp_path, preset, weight_bits, grad_bits):
    """The bytes of a LoCo preset, from the units' shapes alone (numel x bits / 8 + scales), with two microbatches
    and an evaluation of 2 batches every 4 batches: per training step one weight-difference gather per unit (the
    other microbatch's gathers and every backward re-gather come from the reference) and one 2-bit reduce-scatter
    per microbatch, each counted against the collective that ran; each evaluation sends the step's update and is
    counted apart from the training batches, whose next step then sends no weights. The evaluations gather the
    quantized weights as training does (``eval_weights`` for Composer's default evaluator label, ``"eval"``)."""
    k, world, every, batches = 2, 2, 4, 16
    result = _launch(tmp_path, options={"preset": preset, "eval_weights": {"eval": "quantized"}}, microbatch=16 // k,
                     eval_every=every)
    assert result["batches"] == batches
    # FSDP2's chunk per rank of each Linear unit (dim 0 padded to a multiple of W): 32->128, 128->67, 67->16.
    chunks = [cdiv(o, world) * i + cdiv(o, world) for i, o in ((32, 128), (128, 67), (67, 16))]
    update = (world - 1) * sum(symmetric_bytes(n, weight_bits, 2048) for n in chunks)
    scatter = (world - 1) * sum(hadamard_minmax_bytes(n, grad_bits, 256) for n in chunks)
    fp32 = (world - 1) * 4 * sum(chunks)  # the run is fp32: FSDP gathers and reduce-scatters fp32
    after_eval = set(range(every + 1, batches + 1, every))  # batches 5, 9, 13
    metrics = result["metrics"]
    assert metrics["qsdp/weights/bytes_sent"] == [fp32] + [0 if b in after_eval else update
                                                         for b in range(2, batches + 1)]
    assert metrics["qsdp/grads/bytes_sent"] == [k * scatter] * batches
    evals = batches // every
    assert metrics["qsdp/eval/weights/bytes_sent"] == [update] * evals
    assert metrics["qsdp/eval/weights/bytes_bf16"] == [fp32 // 2] * evals
    per_step = [r for b, r in enumerate(metrics["qsdp/compression_vs_unquantized"], 1) if b > 1 and b not in after_eval]
    assert per_step == [pytest.approx((fp32 + k * fp32) / (update + k * scatter), rel=1e-12)] * (batches - 4)
    weights, grads = result["traffic"]["weights"], result["traffic"]["grads"]
    assert weights["sent"] == fp32 + (batches - 1 - len(after_eval)) * update + evals * update
    # Collectives: the keyframe, the updates of the training steps and those of the evaluations, per unit; every
    # other gather (at least the forward and backward of each microbatch) comes from the reference.
    assert weights["calls"] >= 2 * k * 3 * batches + 2 * 3 * evals
    assert weights["served_locally"] == weights["calls"] - 3 * (1 + batches - 1 - len(after_eval) + evals)
    assert grads["calls"] == k * 3 * batches and grads["native"] == k * fp32 * batches
    evaluation = result["eval_traffic"]
    assert evaluation["weights"]["sent"] == evals * update and evaluation["weights"]["calls"] == 2 * 3 * evals
    assert evaluation["weights"]["served_locally"] == 3 * evals and evaluation["grads"]["calls"] == 0
    # Against plain FSDP2 on this stack: every gather in fp32, the served ones included (the forward and backward
    # of each microbatch in a training step), and every microbatch's reduce-scatter.
    plain = [r for b, r in enumerate(metrics["qsdp/compression_vs_plain_fsdp"], 1) if b > 1 and b not in after_eval]
    assert plain == [pytest.approx((2 * k * fp32 + k * fp32) / (update + k * scatter), rel=1e-12)] * (batches - 4)
    assert max(result["param_rel_error"].values()) < 5e-2, result["param_rel_error"]


@pytest.mark.slow  # a 2-process Composer run: 88 s on 2 shared cores
def test_exact_evaluations_send_plain_gathers_and_leave_training_traffic_as_without_them(tmp_path):
    """The default ``eval_weights="exact"`` with the LoCo qWD preset, two microbatches and an evaluation of 2 batches
    every 4: every evaluation gather is FSDP's own fp32 gather, counted apart, and the training batches' bytes are
    those of a run without evaluations (each step sends its weight update: the evaluation advanced no reference)."""
    k, world, every, batches = 2, 2, 4, 16
    result = _launch(tmp_path, options={"preset": "qwd-w4g2-loco"}, microbatch=16 // k, eval_every=every)
    assert result["hyperparameters"]["qsdp/eval_weights"] == "exact"
    chunks = [cdiv(o, world) * i + cdiv(o, world) for i, o in ((32, 128), (128, 67), (67, 16))]
    update = (world - 1) * sum(symmetric_bytes(n, 4, 2048) for n in chunks)
    fp32 = (world - 1) * 4 * sum(chunks)
    metrics = result["metrics"]
    assert metrics["qsdp/weights/bytes_sent"] == [fp32] + [update] * (batches - 1)
    evals = batches // every
    assert metrics["qsdp/eval/weights/bytes_sent"] == [2 * fp32] * evals  # 2 batches, every unit gathered plainly
    evaluation = result["eval_traffic"]["weights"]
    assert evaluation["sent"] == evaluation["native"] == evals * 2 * fp32 and evaluation["calls"] == evals * 2 * 3
    assert result["traffic"]["weights"]["sent"] == fp32 + (batches - 1) * update + evals * 2 * fp32
    assert max(result["param_rel_error"].values()) < 5e-2, result["param_rel_error"]


@pytest.mark.slow  # two 2-process Composer runs: about a minute on 2 shared cores
def test_a_quantized_evaluation_of_weights_swapped_in_place_gathers_them_exactly(tmp_path):
    """Composer's EMA swaps its averaged weights into the model in place at ``EVAL_START`` and back at ``EVAL_END``,
    and Composer's ``eval_forward`` bypasses the model's forward hooks. A quantized evaluation under the LoCo qWD
    preset must still see the swap: its first gather of each unit is a full-precision keyframe of the averaged
    weights (not a 4-bit difference from training's reference), so its metric is the exact evaluation's, bit for
    bit. Training's next gather after the swap back is a keyframe too, in both runs, so their losses agree."""
    world, every, batches = 2, 4, 16
    runs = {}
    for mode in ("exact", "quantized"):
        (tmp_path / mode).mkdir()
        runs[mode] = _launch(tmp_path / mode, options={"preset": "qwd-w4g2-loco", "eval_weights": mode},
                             eval_every=every, ema="2ba")
    exact, quantized = runs["exact"], runs["quantized"]
    assert len(exact["eval_mse"]) == batches // every
    assert quantized["eval_mse"] == exact["eval_mse"]
    assert quantized["losses"] == exact["losses"]
    chunks = [cdiv(o, world) * i + cdiv(o, world) for i, o in ((32, 128), (128, 67), (67, 16))]
    update = (world - 1) * sum(symmetric_bytes(n, 4, 2048) for n in chunks)
    fp32 = (world - 1) * 4 * sum(chunks)
    after_eval = set(range(every + 1, batches + 1, every))
    for result in (exact, quantized):
        assert result["metrics"]["qsdp/weights/bytes_sent"] == [fp32] + [fp32 if b in after_eval else update
                                                                        for b in range(2, batches + 1)]
    evaluation = quantized["eval_traffic"]["weights"]  # per evaluation: a keyframe per unit, then the reference
    assert evaluation["sent"] == batches // every * fp32 and evaluation["served_locally"] == 3 * batches // every


def test_composer_layer_freezing_under_a_loco_preset(tmp_path):
    """Composer's LayerFreezing freezes l1 at the end of epoch 2 inside the root's FSDP unit, whose reduce-scatter
    then carries l2's gradients alone: the w8g4 preset's error feedback restarts there and training goes on, l1
    still from batch 33 on."""
    result = _launch(tmp_path, options={"preset": "w8g4"}, freeze=True)
    assert result["batches"] == 48 and len(result["losses"]) == 48
    first = next(i for i, names in enumerate(result["frozen"]) if names)
    assert first == 32 and result["frozen"][first] == ["l1.weight", "l1.bias"]
    assert all(result["l1_moved"][:first]) and not any(result["l1_moved"][first:])
    assert sum(result["losses"][-4:]) < sum(result["losses"][first - 4 : first])
    assert result["traffic"]["grads"]["calls"] == 2 * 48  # the root's unit and l3's, at every batch


@pytest.mark.slow
def test_composer_run_with_policy_auto(tmp_path):
    # Real measurements on 2 CPU ranks: whatever the policy chooses, it is logged, in force, and training stays right.
    result = _launch(tmp_path, options=AUTO)
    metrics, hyper = result["metrics"], result["hyperparameters"]
    assert hyper["qsdp/policy"] == "auto" and hyper["qsdp/auto/event"] in ("confirmed", "rechecked")
    assert metrics["qsdp/auto/step"] == [2.0, 4.0]  # decided after the warm-up, re-checked one window later
    assert all(p > 0 for p in metrics["qsdp/auto/predicted_step_s"] + metrics["qsdp/auto/measured_step_s"])
    choice = list(hyper["qsdp/auto/choice"].values())
    assert choice == [f"{w}/{g}" for w, g in result["auto_current"]] and len(choice) == 3
    # fp32 ('FULL') collectives: unquantized they send 2x the bf16 bytes; the warm-up batches are unquantized.
    sent, bf16 = (metrics[f"qsdp/weights/{k}"] for k in ("bytes_sent", "bytes_bf16"))
    assert sent[:2] == [2 * b for b in bf16[:2]]
    if any(not c.startswith("off/") for c in choice):
        assert sent[-1] < 2 * bf16[-1]
    losses = result["losses"]
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:2]) / 2, losses
    assert max(result["param_rel_error"].values()) < 2e-2, result["param_rel_error"]


@pytest.mark.slow
@pytest.mark.parametrize("options", [None, QWD, AUTO], ids=["w8g8", "difference", "auto"])
def test_composer_checkpoint_resume_gives_the_same_losses(tmp_path, options):
    ckpt = str(tmp_path / "ckpt")
    saved = _launch(tmp_path, "save", ckpt, options=options)
    resumed = _launch(tmp_path, "resume", ckpt, options=options)
    assert resumed["losses"] == saved["losses"][3:]
    assert resumed["seeds"] == saved["seeds"]  # the seed schedule continues where it stopped
    assert resumed["traffic"] == saved["traffic"]  # cumulative counters are checkpointed too
    assert resumed["keyframes"] == saved["keyframes"]  # a restored reference needs no keyframe
    assert resumed["auto_current"] == saved["auto_current"]  # the policy's choice is checkpointed


@pytest.mark.slow
def test_a_diverged_run_never_checkpoints_non_finite_weights(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = _run(tmp_path, tmp_path / "diverged.json", "diverge", str(ckpt))
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "refusing to write the checkpoint at batch 2" in log, log[-5000:]
    # The folder to resume from (what load_path takes), not one rank's shard file inside it.
    assert f"the last checkpoint written is {ckpt / 'ep0-ba1'}: resume from it (load_path={ckpt / 'ep0-ba1'})" \
        in log, log[-5000:]
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("ep")) == ["ep0-ba1"]


@pytest.mark.gpu
@pytest.mark.parametrize("fsdp_version", [2, 1], ids=["fsdp2", "fsdp1"])
def test_composer_launcher_run_on_two_gpu_ranks(tmp_path, fsdp_version):
    _check_quantized_training(_launch(tmp_path, gpu=True, fsdp_version=fsdp_version), fsdp_version)


LOCO = {"preset": "qwd-w4g2-loco"}


def _residual_files(ckpt: Path) -> dict[tuple[int, ...], str]:
    """The file each residual piece of the sharded checkpoint ``ckpt`` went into, by the piece's offset."""
    from torch.distributed.checkpoint import FileSystemReader

    storage = FileSystemReader(str(ckpt)).read_metadata().storage_data
    return {tuple(index.offset): info.relative_path for index, info in storage.items()
            if index.fqn.startswith("state.callbacks.QSDPResiduals.units.")}


@pytest.mark.slow
def test_loco_sharded_composer_resume_restores_each_ranks_residual(tmp_path):
    """A LoCo run's sharded checkpoint holds each rank's residual, written by that rank; a resume on the same
    number of ranks continues exactly as the uninterrupted run (2-bit gradients: a residual reset changes the
    losses, as the full checkpoint's resume below shows)."""
    ckpt = tmp_path / "ckpt"
    saved = _launch(tmp_path, "save", str(ckpt), options=LOCO)
    files = _residual_files(ckpt / "ep0-ba3")
    assert files == {(0, 0): "__0_0.distcp", (1, 0): "__1_0.distcp"}, files
    resumed = _launch(tmp_path, "resume", str(ckpt), options=LOCO)
    assert resumed["losses"] == saved["losses"][3:]
    assert resumed["traffic"] == saved["traffic"]


@pytest.mark.slow
def test_loco_full_checkpoint_holds_no_residual(tmp_path):
    """A full checkpoint is written by rank 0 alone: it holds the residuals' sizes but no rank's residual (a resume
    from it restarts them from zero with a warning: tests/schemes/test_loco_scheme.py)."""
    import torch

    ckpt = tmp_path / "ckpt"
    _launch(tmp_path, "save", str(ckpt), options=LOCO, fsdp={"state_dict_type": "full"})
    state = torch.load(ckpt / "ep0-ba3-rank0.pt", weights_only=False)["state"]
    assert state["callbacks"]["QSDPResiduals"] == {}
    (qsdp,) = [s for name, s in state["algorithms"] if name == "QSDP"]
    grads = [unit["grads"] for unit in qsdp["qsdp"]["units"]]
    assert all(g["residual_numel"] > 0 and g["residual_ranks"] == 2 and "residual" not in g for g in grads), grads


@pytest.mark.slow
def test_loco_resume_on_another_number_of_ranks_restarts_the_residuals_with_a_warning(tmp_path):
    ckpt = tmp_path / "ckpt"
    _launch(tmp_path, "save", str(ckpt), options=LOCO)
    out = tmp_path / "result-resume.json"
    proc = _run(tmp_path, out, "resume", str(ckpt), options=LOCO, nproc=3)
    assert proc.returncode == 0, f"launcher failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    logs = proc.stdout + proc.stderr
    assert "LoCoResidualWarning" in logs and "saved by 2 ranks and this run has 3" in logs, logs[-5000:]
    assert json.loads(out.read_text())["batches"] == 6
