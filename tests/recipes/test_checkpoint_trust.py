"""A checkpoint loads as data, not code (issue 51, "checkpoints hold tensors"): the recipes' own checkpoints (full
and sharded, one and two processes) resume with the default loaders and train exactly as an uninterrupted run;
a full checkpoint, a sharded checkpoint's ``.metadata`` or one of its ``.distcp`` items whose pickle would call
``eval`` is refused through ``load_path`` and ``autoresume`` before any of it runs, naming the file, the global and
``trust_checkpoint``; with ``trust_checkpoint: true`` it loads as Composer loads it (the code runs: the opt-in is
the only way in). One process in-process (``main``), plus one spawn of 2 ranks over gloo."""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path

import numpy
import pytest
import torch
from dist_spawn import RankInfo, run_ranks
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

import composer_qsdp.recipes.compat as compat
from composer_qsdp.recipes.checksums import manifest_path
from composer_qsdp.recipes.safe_load import UntrustedCheckpointError, checkpoint_loading
from composer_qsdp.recipes.train import RECIPE_ERROR_STATUS, RecipeError, load_recipe, main, train
from test_train import BASELINE, corpus_shards, tiny_overrides, train_losses  # noqa: F401 (fixture)

COMMON = ["max_duration=4ba", "eval_interval=4ba", "save_interval=2ba"]
#: What each kind of checkpoint needs on the command line: a full checkpoint is written and read as one file.
KINDS = {"sharded": [], "full": ["fsdp.state_dict_type=full"]}
#: Where an attack sits: the full checkpoint's file, a sharded one's .metadata, one of its .distcp items.
KINDS_ATTACKED = ["pt", "metadata", "distcp"]


def _run(shards: Path, run: Path, *extra: str) -> int:
    return main([str(BASELINE), *tiny_overrides(shards, run, *COMMON, *extra)])


@pytest.fixture(scope="module")
def saved(corpus_shards, tmp_path_factory) -> dict[str, Path]:
    """Kind -> the run folder of an uninterrupted 4-batch run (its save folder ``ckpt`` holds the checkpoints after
    batches 2 and 4, its metrics the losses)."""
    runs = {}
    for kind, extra in KINDS.items():
        runs[kind] = tmp_path_factory.mktemp(kind)
        assert _run(corpus_shards, runs[kind], f"save_folder={runs[kind] / 'ckpt'}", *extra) == 0
    return runs


def _checkpoint(folder: Path, kind: str, batch: int) -> Path:
    return folder / (f"ep0-ba{batch}" if kind == "sharded" else f"ep0-ba{batch}-rank0.pt")


# ------------------------------------------------------------------------------------- the recipes' own
@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_of_the_recipes_resumes_by_default_and_trains_exactly(corpus_shards, saved, tmp_path, kind):
    assert _run(corpus_shards, tmp_path, f"load_path={_checkpoint(saved[kind] / 'ckpt', kind, 2)}",
                *KINDS[kind]) == 0
    uninterrupted = train_losses(saved[kind])
    assert train_losses(tmp_path) == {b: uninterrupted[b] for b in (2, 3)}  # same weights, optimizer, data position


def _same(a: object, b: object, where: str = "") -> None:
    """``a`` and ``b`` are the same nested value: same types throughout, tensors and arrays equal bit for bit."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, numpy.ndarray):
        assert a.dtype == b.dtype and numpy.array_equal(a, b), where
    else:
        assert a == b or (a != a and b != b), where  # NaN (a float) equals itself here


def test_the_default_loader_reads_what_composers_reads(saved):
    """Every value of a full checkpoint, and of a sharded one's .metadata, as pickle reads them."""
    full = _checkpoint(saved["full"] / "ckpt", "full", 4)
    _same(compat.load_checkpoint_file(full, full), torch.load(full, weights_only=False))
    metadata = _checkpoint(saved["sharded"] / "ckpt", "sharded", 4) / ".metadata"
    with open(metadata, "rb") as f:
        safe = compat.load_dcp_metadata(f)
    assert safe == pickle.loads(metadata.read_bytes())


# --------------------------------------------------------------------------------------------- attacks
class _Runs:
    """Unpickled, evaluates ``expression``: writes ``marker`` and gives ``value`` (so that a trusted load goes on
    as if nothing had happened)."""

    def __init__(self, marker: Path, value: object = None) -> None:
        self.expression = f"(__import__('pathlib').Path({str(marker)!r}).write_text('ran'), {value!r})[1]"

    def __reduce__(self):
        return eval, (self.expression,)


def _attack(folder: Path, kind: str, marker: Path) -> Path:
    """Put a pickle that writes ``marker`` into the newest checkpoint of the save folder ``folder`` (a copy): into
    the full checkpoint file (``pt``), the sharded one's ``.metadata`` or one of its ``.distcp`` items; drop its
    manifest (whoever writes a checkpoint can write its manifest too). Returns the file that holds it."""
    checkpoint = _checkpoint(folder, "full" if kind == "pt" else "sharded", 4)
    manifest_path(checkpoint).unlink()
    if kind == "pt":
        state = torch.load(checkpoint, weights_only=False)
        state["note"] = _Runs(marker)  # a key Composer ignores
        torch.save(state, checkpoint)
        return checkpoint
    metadata_file = checkpoint / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())
    if kind == "metadata":
        metadata.note = _Runs(marker)
        metadata_file.write_bytes(pickle.dumps(metadata))
        return metadata_file
    # A .distcp item: the run name, rewritten at the end of the shard file, its place in .metadata moved there.
    index = next(i for i in metadata.storage_data if i.fqn == "state.run_name")
    assert isinstance(metadata.state_dict_metadata["state.run_name"], BytesStorageMetadata)
    info = metadata.storage_data[index]
    shard = checkpoint / info.relative_path
    item = io.BytesIO()
    torch.save(_Runs(marker, "gpt-tiny-baseline"), item)
    info.offset, info.length = shard.stat().st_size, len(item.getvalue())
    with open(shard, "ab") as f:
        f.write(item.getvalue())
    metadata_file.write_bytes(pickle.dumps(metadata))
    return shard


@pytest.fixture
def attacked(saved, tmp_path):
    """``(kind, route)`` -> the overrides that load a checkpoint attacked by :func:`_attack` through ``route``
    (``load_path`` or ``autoresume``), the file that holds the attack, and the marker it writes."""

    def make(kind: str, route: str) -> tuple[list[str], Path, Path]:
        written = "full" if kind == "pt" else "sharded"
        folder, marker = tmp_path / "ckpt", tmp_path / "ran"
        shutil.copytree(saved[written] / "ckpt", folder, symlinks=True)
        file = _attack(folder, kind, marker)
        where = [f"load_path={_checkpoint(folder, written, 4)}"] if route == "load_path" else \
            [f"save_folder={folder}", "autoresume=true"]
        return [*KINDS[written], *where], file, marker

    return make


@pytest.mark.parametrize("route", ["load_path", "autoresume"])
@pytest.mark.parametrize("kind", KINDS_ATTACKED)
def test_a_checkpoint_that_would_run_code_is_refused_before_it_runs(corpus_shards, attacked, tmp_path, capsys, kind,
                                                                    route):
    overrides, file, marker = attacked(kind, route)
    assert _run(corpus_shards, tmp_path, *overrides) == RECIPE_ERROR_STATUS
    error = capsys.readouterr().err
    assert f"recipe error: recipe key '{route}'" in error, error
    assert f"checkpoint file {file.resolve()}" in error and "needs the global builtins.eval, " in error, error
    assert "trust_checkpoint: true" in error and "trust_checkpoint=True" in error, error
    assert not marker.exists()


@pytest.mark.parametrize("kind, route", [("pt", "autoresume"), ("metadata", "load_path"),
                                         ("distcp", "autoresume")])
def test_trust_checkpoint_loads_it_as_composer_does(corpus_shards, attacked, tmp_path, kind, route):
    overrides, _, marker = attacked(kind, route)
    assert _run(corpus_shards, tmp_path, *overrides, "trust_checkpoint=true", "max_duration=5ba") == 0
    assert marker.read_text() == "ran"  # the opt-in is the door: the same file ran its code


def test_trust_checkpoint_is_a_bool():
    assert load_recipe(BASELINE).cfg.trust_checkpoint is False
    with pytest.raises(RecipeError, match="recipe key 'trust_checkpoint' has the wrong type"):
        load_recipe(BASELINE, ["trust_checkpoint=maybe"])
    with pytest.raises(ValueError, match="trust_checkpoint='yes' is invalid; it must be True or False"):
        checkpoint_loading(trust_checkpoint="yes")


def test_checkpoint_loading_guards_composers_loaders_and_restores_them(tmp_path):
    """For a Trainer of one's own: Composer's full-checkpoint loader inside the context, a tar archive refused
    before extraction; the hooks are gone after it."""
    import torch.distributed.checkpoint.filesystem as dcp_filesystem
    from composer.utils import checkpoint as composer_checkpoint
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    marker = tmp_path / "ran"
    file = tmp_path / "ckpt.pt"
    torch.save({"state": {}, "note": _Runs(marker)}, file)
    original, original_load_bytes = composer_checkpoint._torch_load_with_validation, DefaultLoadPlanner.load_bytes
    with checkpoint_loading(), pytest.raises(UntrustedCheckpointError) as err:
        composer_checkpoint.safe_torch_load(str(file))
    assert (err.value.path, err.value.needs) == (str(file.resolve()), "the global builtins.eval")
    assert not marker.exists()
    with checkpoint_loading(), pytest.raises(UntrustedCheckpointError, match="a tar archive's extraction"):
        composer_checkpoint.download_checkpoint(path=str(tmp_path / "ckpt.tar.gz"),
                                                node_checkpoint_folder=str(tmp_path), object_store=None,
                                                progress_bar=False)
    assert composer_checkpoint._torch_load_with_validation is original
    assert dcp_filesystem.pickle is pickle and DefaultLoadPlanner.load_bytes is original_load_bytes
    with checkpoint_loading(trust_checkpoint=True):
        assert composer_checkpoint.safe_torch_load(str(file))["note"] is None
    assert marker.read_text() == "ran"


# ------------------------------------------------------------------------------------------ two processes
def _two_ranks(info: RankInfo, shards: Path, run: Path) -> dict:
    """Rank side: an uninterrupted run saving a sharded checkpoint at batch 2, the resume from it, and the resume
    from a copy whose .metadata would run code."""
    os.environ.update(LOCAL_WORLD_SIZE=str(info.world_size), NODE_RANK="0")
    import torch.distributed as dist

    def recipe(folder: Path, *extra: str):
        return load_recipe(BASELINE, tiny_overrides(shards, folder, *COMMON, *extra), world_size=info.world_size)

    train(recipe(run / "full", f"save_folder={run / 'full' / 'ckpt'}"))
    train(recipe(run / "resumed", f"load_path={run / 'full' / 'ckpt' / 'ep0-ba2'}"))
    if info.rank == 0:
        shutil.copytree(run / "full" / "ckpt", run / "attacked", symlinks=True)
        _attack(run / "attacked", "metadata", run / "ran")
    dist.barrier()
    try:
        train(recipe(run / "refused", f"load_path={run / 'attacked' / 'ep0-ba4'}"))
    except RecipeError as err:
        refused = str(err)
    else:
        refused = None
    return {"refused": refused, "ran": (run / "ran").exists()}


def test_two_ranks_resume_a_sharded_checkpoint_by_default_and_refuse_one_that_runs_code(corpus_shards, tmp_path):
    results = run_ranks(_two_ranks, 2, corpus_shards, tmp_path, timeout_s=400)
    uninterrupted = train_losses(tmp_path / "full")
    assert sorted(uninterrupted) == [0, 1, 2, 3]
    assert train_losses(tmp_path / "resumed") == {b: uninterrupted[b] for b in (2, 3)}
    # Every rank refuses it (none waits for the other in a collective), and none ran it.
    checkpoint = tmp_path / "attacked" / "ep0-ba4"
    for rank in results:
        assert rank["refused"].startswith(f"recipe key 'load_path' = '{checkpoint}': checkpoint file "
                                          f"{(checkpoint / '.metadata').resolve()} needs the global builtins.eval"), \
            rank["refused"]
        assert not rank["ran"]
