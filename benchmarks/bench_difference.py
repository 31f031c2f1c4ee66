"""The codec work of one weight all-gather, per scheme, on one CUDA GPU: what the weight-difference scheme (qWD)
costs beyond the direct one without fused difference kernels.

The schemes run on a 1-rank NCCL group, so the collective is a local copy and each call's time is its codec
work: the direct scheme encodes the shard and decodes it into the output; the difference scheme's first gather
of a step casts the shard and its reference slice to fp32, subtracts, encodes, decodes in fp32, adds into the
reference and copies the reference into the output (SDP4Bit fuses the subtraction into the quantize and the
addition into the dequantize; we do not yet); every other gather of the step copies the reference. At world size
W a rank encodes ``1/W`` of what it decodes, so these 1-rank times bound the encode side from above.

Each call is timed with ``triton.testing.do_bench`` (median), bf16 weights, the codecs of the recipes (W8G8 and
W4G4: min-max stochastic, bucket 1024; qWD: symmetric INT4, bucket 2048), beside a device copy of the same
tensor, after one discarded pass. With ``--out-dir DIR`` also writes ``DIR/bench_difference.{md,json}``.

Usage::

    python benchmarks/bench_difference.py            # 16M and 64M elements (a GPT-1.3B block has 50M)
    python benchmarks/bench_difference.py --profile  # where the host time of 200 direct 4-bit gathers goes
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile

import torch
import torch.distributed as dist

import kernel_timing as timing
from composer_qsdp.comm import Topology
from composer_qsdp.quant import make_codec
from composer_qsdp.schemes import DifferenceAllGather, DirectAllGather, WeightScheme
from kernel_timing import MI


def _schemes() -> dict[str, WeightScheme]:
    """The weight schemes of the recipes, by row label."""
    return {
        "direct, min-max 8-bit (W8G8)": DirectAllGather(make_codec("minmax", bits=8, bucket_size=1024)),
        "direct, min-max 4-bit (W4G4)": DirectAllGather(make_codec("minmax", bits=4, bucket_size=1024)),
        "difference, symmetric 4-bit (qWD)": DifferenceAllGather(make_codec("symmetric", bits=4, bucket_size=2048)),
    }


def _measure(size: int) -> list[timing.Row]:
    """One row per scheme call on ``size`` bf16 elements, plus the device copy."""
    group = dist.group.WORLD
    weights = torch.randn(size, device=timing.DEVICE, dtype=torch.bfloat16) * 0.02
    output = torch.empty_like(weights)
    copy_ms = timing.median_ms(lambda: output.copy_(weights))
    rows = [{"elements": size, "call": "device copy (the collective at world size 1)", "ms": copy_ms}]
    for label, scheme in _schemes().items():
        scheme.setup(group, Topology(1))
        scheme.all_gather(output, weights, seed=0)  # the difference scheme's keyframe
        if isinstance(scheme, DifferenceAllGather):
            def first() -> None:
                scheme.on_optimizer_step()
                scheme.all_gather(output, weights, seed=1)

            rows.append({"elements": size, "call": f"{label}: first gather of a step", "ms": timing.median_ms(first)})
            rows.append({"elements": size, "call": f"{label}: later gathers of the step",
                         "ms": timing.median_ms(lambda: scheme.all_gather(output, weights, seed=1))})  # fmt: skip
        else:
            rows.append({"elements": size, "call": f"{label}: every gather",
                         "ms": timing.median_ms(lambda: scheme.all_gather(output, weights, seed=1))})  # fmt: skip
        print(f"  {size // MI}M {rows[-1]['call']}: {rows[-1]['ms'] * 1e3:.0f} us", flush=True)
    for row in rows:
        row["x_copy"] = row["ms"] / copy_ms
    return rows


def _profile() -> None:
    """cProfile of 200 direct 4-bit gathers of 16M elements (host time: the GPU work is shorter)."""
    scheme = _schemes()["direct, min-max 4-bit (W4G4)"]
    scheme.setup(dist.group.WORLD, Topology(1))
    weights = torch.randn(16 * MI, device=timing.DEVICE, dtype=torch.bfloat16)
    output = torch.empty_like(weights)
    for seed in range(20):
        scheme.all_gather(output, weights, seed=seed)
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for seed in range(200):
        scheme.all_gather(output, weights, seed=seed)
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="store_true", help="only the host profile of the direct gather")
    timing.add_out_dir(parser)
    args = parser.parse_args()
    if timing.cuda_missing():
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1,
                                device_id=torch.device(timing.DEVICE, 0))  # fmt: skip
        if args.profile:
            _profile()
            dist.destroy_process_group()
            return 0
        try:
            header = timing.header()
            # A first pass, discarded: without it the first size measured 2x slower (first run, 81ca919).
            _measure(16 * MI)
            rows = [row for size in (16 * MI, 64 * MI) for row in _measure(size)]
        finally:
            dist.destroy_process_group()
    lines = ["| elements | call | us | x device copy |", "|---:|---|---:|---:|"]
    lines += [f"| {r['elements'] // MI}M | {r['call']} | {r['ms'] * 1e3:.0f} | {r['x_copy']:.1f} |" for r in rows]
    text = timing.header_text(header) + "One bf16 weight all-gather at world size 1 (codec work only).\n\n"
    text += "\n".join(lines)
    print("\n" + text)
    timing.write_out(args.out_dir, "bench_difference", text, {"header": header, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
