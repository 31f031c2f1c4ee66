"""Relative error of quantized weight all-gathers on a GPT, per bucketing choice (CPU, 2 gloo ranks).

FSDP concatenates a unit's parameter shards, so a plain bucket can hold LayerNorm gains (near 1) beside weights of
scale 0.02, and the gains set the quantization step for both. A Hadamard rotation (``--hadamard``) spreads outliers
over the bucket, but it turns a bucket's mean into one large coefficient (a block of gains of 1 rotates into a
spike of sqrt(n)), which then sets the min-max step for the whole bucket. This measures, on the real FSDP2
units of a GPT (one per block, plus the root with the embeddings), the sampled relative error
``||decode(encode(w)) - w|| / ||w||`` of each unit's first weight all-gather, for:

* ``plain``: buckets run across parameter boundaries (the default);
* ``aligned``: every parameter's piece starts a bucket of its own (``align_buckets``);
* ``aligned, norms and biases raw``: also ``unquantized_params=["*ln_*", "*.bias"]``.

    python benchmarks/weight_error.py --model 125m --bits 4 [--bucket-size 1024] [--codec minmax] \
        [--rounding stochastic|nearest] [--hadamard] [--gain-std 0.05]

Weights are the model's initialization (seeded): LayerNorm gains 1, biases 0, weights N(0, 0.02). A bucket of equal
gains rotates into one spike and zeros, which the min-max lattice holds exactly, so initialization hides what the
rotation costs once training moves the gains apart: ``--gain-std S`` sets every LayerNorm gain to 1 + N(0, S).
Prints a markdown table (and writes ``weight_error-w{bits}-{rounding}[-hadamard][-gains{S}].{md,json}`` into
``--out-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import git_revision  # noqa: E402

VARIANTS = {
    "plain": {},
    "aligned": {"align_buckets": True},
    "aligned, norms and biases raw": {"align_buckets": True, "unquantized_params": ["*ln_*", "*.bias"]},
}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from composer_qsdp import apply_qsdp, remove_qsdp
    from composer_qsdp.config import from_preset
    from composer_qsdp.recipes.models import GPT, gpt_config

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = GPT(gpt_config(args.model))
    if args.gain_std:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if fnmatchcase(name, "*ln_*.weight"):
                    p.normal_(1.0, args.gain_std)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    tokens = torch.randint(0, 50257, (1, 16))
    rows = {}
    for name, options in VARIANTS.items():
        config = from_preset("w8g8", weight_bits=args.bits, weight_codec=args.codec, bucket_size=args.bucket_size,
                             weight_rounding=args.rounding, weight_codec_options={"hadamard": args.hadamard},
                             weight_scheme_options=options, error_sample_interval=1)
        handle = apply_qsdp(model, config)
        with torch.no_grad():
            model(tokens)
        handle.release_gathered_weights()  # a forward without a backward leaves the root gathered
        errors = {u.name or "<root>": u.weights.take_error().item() for u in handle.units}
        rows[name] = {"wire_bytes": handle.traffic().weights.sent, "errors": errors}
        remove_qsdp(model)
    if rank == 0:
        out.write_text(json.dumps(rows))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="125m", help="GPT preset (default 125m)")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--bucket-size", type=int, default=1024)
    parser.add_argument("--codec", default="minmax")
    parser.add_argument("--rounding", default="stochastic", choices=("stochastic", "nearest"))
    parser.add_argument("--hadamard", action="store_true", help="rotate each bucket by a Hadamard transform first")
    parser.add_argument("--gain-std", type=float, default=0.0,
                        help="LayerNorm gains drawn from 1 + N(0, this) instead of 1 (default 0: initialization)")
    parser.add_argument("--world", type=int, default=2, help="gloo ranks (default 2)")
    parser.add_argument("--out-dir", type=Path, help="also write the table and its JSON record here")
    args = parser.parse_args(argv)
    if not args.gain_std >= 0:
        parser.error(f"--gain-std={args.gain_std} is invalid; it must be >= 0 (0: the gains at initialization)")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"weight_error_{os.getpid()}.json"
    mp.spawn(_rank, args=(args.world, 29600 + os.getpid() % 1000, args, out), nprocs=args.world)
    rows = json.loads(out.read_text())
    command = "python benchmarks/weight_error.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        f"# {args.bits}-bit weight all-gather error by bucketing (GPT-{args.model}, {args.codec}, "
        f"{args.rounding}{', Hadamard-rotated' if args.hadamard else ''}, buckets of {args.bucket_size}, "
        f"{args.world} ranks)",
        "",
        f"git {git_revision()}, `{command}`, CPU (gloo), weights at initialization"
        + (f", LayerNorm gains 1 + N(0, {args.gain_std})." if args.gain_std else "."),
        "",
        "| bucketing | mean rel. error, blocks | root (embeddings, final norm) | weight bytes sent per rank |",
        "|---|---|---|---|",
    ]
    for name, row in rows.items():
        blocks = [e for unit, e in row["errors"].items() if unit.startswith("blocks.")]
        lines.append(f"| {name} | {statistics.mean(blocks):.4f} | {row['errors']['<root>']:.4f} | "
                     f"{row['wire_bytes']:,} |")
    text = "\n".join(lines)
    print(text)
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        stem = (f"weight_error-w{args.bits}-{args.rounding}{'-hadamard' if args.hadamard else ''}"
                f"{f'-gains{args.gain_std:g}' if args.gain_std else ''}")
        (args.out_dir / f"{stem}.md").write_text(text + "\n")
        record = {"args": {**vars(args), "out_dir": str(args.out_dir)}, "rows": rows}
        (args.out_dir / f"{stem}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
