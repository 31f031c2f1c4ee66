"""Quantized all-gather / reduce-scatter against bf16 NCCL collectives, on N GPUs of one host.

For total message sizes of 16, 64, 256 and 512 MB (the bf16 size of the all-gather's output and of the
reduce-scatter's input, as nccl-tests counts them) it times:

* bf16 NCCL ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (``AVG``), the baseline;
* ``composer_qsdp.comm.quantized_all_gather`` / ``quantized_reduce_scatter`` of the same bf16 tensors with the
  min-max codec at 8, 4 and 2 bits (stochastic rounding, buckets of 1024): encode, the byte collective, decode
  (decode-sum in fp32 for the reduce-scatter), everything the FSDP integration runs per call;
* with ``--two-level``: NCCL's bf16 ``all_to_all_single`` of the reduce-scatter's input (the transport under the
  quantized reduce-scatters), and ``two_level_reduce_scatter`` with the gradient settings of the ``tlq-hs`` and
  ``zeropp`` presets on ``--ranks-per-node`` ranks per (virtual) node (default: all on one node). On 2 GPUs,
  ``--ranks-per-node 1`` times the inter-node hop alone and the default the intra-node hop alone; on 4,
  ``--ranks-per-node 2`` times both hops.

Each case runs ``--warmup`` untimed and ``--iters`` timed calls; every call is timed with CUDA events on the
current stream, the median is taken per rank and the table reports the slowest rank's median. Bus bandwidth
follows nccl-tests: ``size / time * (W - 1) / W``, with ``size`` the bf16 message ("bf16-equivalent busbw",
what the quantized call delivers) and, for quantized rows, also the bytes actually on the wire ("wire busbw").

The NCCL environment is the caller's (printed in the header); keep ``NCCL_NVLS_ENABLE=0``. The emulated slow
network of the project's measurements::

    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo

Usage (one process per GPU, spawned here; under ``torchrun`` the launcher's processes are used instead)::

    NCCL_NVLS_ENABLE=0 python benchmarks/bench_collectives.py                # all visible GPUs
    NCCL_NVLS_ENABLE=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo \\
        python benchmarks/bench_collectives.py                               # tag "socket" in the output names
    python benchmarks/bench_collectives.py --quick                           # 16 MB and 64 MB, 8 and 4 bits
    python benchmarks/bench_collectives.py --two-level --ranks-per-node 1 --tag socket-2level  # + two-level rows

The host column is the median time one call takes to return, i.e. to enqueue its work; when it exceeds the device
time, back-to-back calls are bound by the host. On one GPU (``--nproc 1``) the collectives are local copies and
the bus-bandwidth columns are 0: the table then shows what a quantized call costs besides the network (encode,
decode, copies, launches), e.g. its fixed cost per call at small sizes::

    python benchmarks/bench_collectives.py --nproc 1 --sizes 0.25 1 16 64 256 --bits 8 4 --profile 200

``--profile N`` also runs N 8-bit calls of each op at the first size under ``cProfile`` on rank 0 and writes the
functions with the most own time to ``DIR/bench_collectives-<tag>-profile.txt`` (with ``--out-dir DIR``).

Prints the markdown table; with ``--out-dir DIR`` also writes ``DIR/bench_collectives-<tag>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import platform
import pstats
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from composer_qsdp.comm import (Topology, node_groups, quantized_all_gather, quantized_reduce_scatter,
                                two_level_reduce_scatter)
from composer_qsdp.config import from_preset
from composer_qsdp.quant import make_codec
from composer_qsdp.schemes import build_scheme

import e2e_common as common
from provenance import command_line, git_revision

MB = 10**6
BF16 = 2
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL", "CUDA_VISIBLE_DEVICES", "TORCH_SYMM_MEM")


def _network_tag() -> str:
    if os.environ.get("NCCL_NET") == "Socket" or os.environ.get("NCCL_P2P_DISABLE") == "1":
        return "socket"
    return "default"


def _header(world: int, command: str) -> dict[str, str]:
    props = torch.cuda.get_device_properties(0)
    env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES))
    return {
        "device": f"{world} x {props.name} ({props.total_memory / 2**30:.0f} GiB), host {socket.gethostname()}",
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git": git_revision(),
        "env": env or "(no NCCL_* variables set)",
        "command": command,
    }


def _time_ms(fn: Callable[[int], object], warmup: int, iters: int) -> tuple[float, float]:
    """Medians over ``iters`` calls of ``fn(i)``: the device time, each call timed with CUDA events on the current
    stream, and the host time the call takes to return (to enqueue its work)."""
    for i in range(warmup):
        fn(i)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    host: list[float] = []
    for i, (start, end) in enumerate(events):
        start.record()
        begin = time.perf_counter()
        fn(warmup + i)
        host.append((time.perf_counter() - begin) * 1e3)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events), statistics.median(host)


def _run_cases(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> list[dict]:
    rows: list[dict] = []
    for size_mb in args.sizes:
        rows += _run_size(args, size_mb, rank, world, device)
        # The size's buffers died with _run_size's frame: give their cached blocks back before the next size.
        torch.cuda.empty_cache()
    return rows


def _run_size(args: argparse.Namespace, size_mb: float, rank: int, world: int, device: torch.device) -> list[dict]:
    """The rows of every case at a total message of ``size_mb`` MB."""
    group = dist.group.WORLD
    rows: list[dict] = []
    total = int(size_mb * MB) // BF16 // world * world  # elements of the full message, divisible by W
    chunk = total // world
    ag_in = torch.randn(chunk, device=device, dtype=torch.bfloat16)
    ag_out = torch.empty(total, device=device, dtype=torch.bfloat16)
    rs_in = torch.randn(total, device=device, dtype=torch.bfloat16)
    rs_out = torch.empty(chunk, device=device, dtype=torch.bfloat16)
    # (op, precision, the call, wire bytes this rank sends per call, of which to other nodes)
    peers = (world - 1) * chunk * BF16
    cases: list[tuple[str, str, Callable[[int], object], int, int]] = [
        ("all_gather", "bf16", lambda i: dist.all_gather_into_tensor(ag_out, ag_in, group=group), peers, 0),
        ("reduce_scatter", "bf16",
         lambda i: dist.reduce_scatter_tensor(rs_out, rs_in, op=dist.ReduceOp.AVG, group=group), peers, 0),
    ]
    for bits in args.bits:
        codec = make_codec("minmax", bits=bits, bucket_size=args.bucket_size, rounding="stochastic")
        wire = (world - 1) * codec.wire_bytes(chunk)
        cases += [
            ("all_gather", f"{bits}-bit",
             lambda i, c=codec: quantized_all_gather(ag_out, ag_in, c, group, seed=i), wire, 0),
            ("reduce_scatter", f"{bits}-bit",
             lambda i, c=codec: quantized_reduce_scatter(rs_out, rs_in, c, group, dist.ReduceOp.AVG, seed=i),
             wire, 0),
        ]
    if args.two_level:
        cases += _two_level_cases(args, rs_in, rs_out, world)
    for op, precision, fn, wire_bytes, inter_bytes in cases:
        dist.barrier()
        timed = _time_ms(fn, args.warmup, args.iters)
        medians: list[tuple[float, float]] = [(0.0, 0.0)] * world
        dist.all_gather_object(medians, timed)
        ms, host_ms = max(m[0] for m in medians), max(m[1] for m in medians)
        rows.append({"op": op, "size_mb": size_mb, "precision": precision, "ms": ms,
                     "ms_per_rank": [m[0] for m in medians], "host_ms": host_ms, "wire_bytes_per_rank": wire_bytes,
                     "inter_node_bytes_per_rank": inter_bytes, "bf16_bytes": total * BF16})  # fmt: skip
        if rank == 0:
            print(f"  {op:<15} {size_mb:>6g} MB {precision:>6}: {ms:9.3f} ms (host {host_ms:.3f} ms)", flush=True)
    return rows


def _two_level_cases(args: argparse.Namespace, rs_in: torch.Tensor, rs_out: torch.Tensor,
                     world: int) -> list[tuple[str, str, Callable[[int], object], int, int]]:  # fmt: skip
    """bf16 all-to-all, and the two-level reduce-scatter with each preset's gradient codecs."""
    group = dist.group.WORLD
    split = node_groups(Topology(args.ranks_per_node or world), group)
    a2a_out = torch.empty_like(rs_in)
    cases = [("all_to_all", "bf16", lambda i: dist.all_to_all_single(a2a_out, rs_in, group=group),
              (world - 1) * rs_out.numel() * BF16, 0)]
    for preset in ("tlq-hs", "zeropp"):
        config = from_preset(preset)
        scheme = build_scheme("grads", config.grads, config.grads.bits)

        def call(i: int, s=scheme):
            return two_level_reduce_scatter(rs_out, rs_in, s.intra_codec, s.codec, group, split, dist.ReduceOp.AVG,
                                            i, rotation_block=s.rotation_block)  # fmt: skip

        traffic = call(0)
        cases.append(("reduce_scatter", f"{preset} {split.nodes}x{split.ranks_per_node}", call, traffic.sent,
                      traffic.inter_node))
    return cases


def _profile(args: argparse.Namespace, world: int, device: torch.device) -> str:
    """``cProfile`` of ``args.profile`` 8-bit quantized all-gathers and reduce-scatters at the first size: the 25
    functions with the most own time per op (rank 0's text; the other ranks run the same calls unprofiled)."""
    group = dist.group.WORLD
    total = int(args.sizes[0] * MB) // BF16 // world * world
    ag_in = torch.randn(total // world, device=device, dtype=torch.bfloat16)
    ag_out = torch.empty(total, device=device, dtype=torch.bfloat16)
    rs_in = torch.randn(total, device=device, dtype=torch.bfloat16)
    codec = make_codec("minmax", bits=8, bucket_size=args.bucket_size, rounding="stochastic")
    calls = {"all_gather": lambda i: quantized_all_gather(ag_out, ag_in, codec, group, seed=i),
             "reduce_scatter": lambda i: quantized_reduce_scatter(ag_in, rs_in, codec, group, dist.ReduceOp.AVG,
                                                                  seed=i)}  # fmt: skip
    text = []
    for op, fn in calls.items():
        for i in range(args.warmup):
            fn(i)
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(args.profile):
            fn(i)
        profiler.disable()
        torch.cuda.synchronize()
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(25)
        text.append(f"### {op}, {args.sizes[0]:g} MB, 8-bit, {args.profile} calls\n{stream.getvalue()}")
    return "\n".join(text)


def _finish_rows(rows: list[dict], world: int) -> None:
    baseline = {(r["op"], r["size_mb"]): r["ms"] for r in rows if r["precision"] == "bf16"}
    factor = (world - 1) / world
    for r in rows:
        seconds = r["ms"] * 1e-3
        r["ratio_vs_bf16"] = r["ms"] / baseline[(r["op"], r["size_mb"])]
        r["busbw_gbps"] = r["bf16_bytes"] / seconds * factor / 1e9
        # wire_bytes_per_rank already is (W-1)/W of the wire volume.
        r["wire_busbw_gbps"] = r["wire_bytes_per_rank"] / seconds / 1e9


def _table(header: dict[str, str], rows: list[dict]) -> str:
    lines = [f"### bench_collectives ({header['device']})", ""]
    lines += common.header_lines(header)
    lines += ["", "| op | size (MB, bf16) | precision | time (ms, median) | quantized / bf16 | busbw bf16-equiv "
              "(GB/s) | wire busbw (GB/s) | wire MB per rank | host ms per call |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['size_mb']:g} | {r['precision']} | {r['ms']:.3f} | {r['ratio_vs_bf16']:.2f} "
                     f"| {r['busbw_gbps']:.1f} | {r['wire_busbw_gbps']:.1f} | {r['wire_bytes_per_rank'] / MB:.1f} "
                     f"| {r['host_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def _worker(local_rank: int, args: argparse.Namespace, world: int, command: str) -> None:
    if "RANK" not in os.environ:  # spawned here, not by torchrun
        os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank = dist.get_rank()
    try:
        if rank == 0:  # only rank 0 writes the record: one set of git and device queries
            header = _header(world, command)
            print("\n".join(f"{k}: {v}" for k, v in header.items()), flush=True)
        rows = _run_cases(args, rank, world, torch.device("cuda", local_rank))
        profile = _profile(args, world, torch.device("cuda", local_rank)) if args.profile else ""
        if rank == 0:
            _finish_rows(rows, world)
            table = _table(header, rows)
            print(table, flush=True)
            if args.out_dir is not None:
                out = args.out_dir
                out.mkdir(parents=True, exist_ok=True)
                name = f"bench_collectives-{args.tag}"
                (out / f"{name}.md").write_text(table)
                (out / f"{name}.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
                if profile:
                    (out / f"{name}-profile.txt").write_text(profile)
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=torch.cuda.device_count(), help="GPUs (default: all)")
    parser.add_argument("--sizes", type=float, nargs="+", default=[16, 64, 256, 512], help="message sizes, MB")
    parser.add_argument("--bits", type=int, nargs="+", default=[8, 4, 2])
    parser.add_argument("--bucket-size", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--tag", default=_network_tag(), help="output name suffix (default: socket/default)")
    parser.add_argument("--quick", action="store_true", help="16 and 64 MB at 8 and 4 bits")
    parser.add_argument("--profile", type=int, default=0,
                        help="also profile this many 8-bit calls of each op at the first size (cProfile, rank 0)")
    parser.add_argument("--two-level", action="store_true",
                        help="also bf16 all_to_all and the two-level reduce-scatter of the tlq-hs and zeropp presets")
    parser.add_argument("--ranks-per-node", type=int,
                        help="ranks per (virtual) node of the two-level rows (default: all ranks on one node)")
    parser.add_argument("--out-dir", type=Path, help="also write bench_collectives-<tag>.md/.json (and the profile) here")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.bits = [16, 64], [8, 4]
    if not torch.cuda.is_available():
        print("bench_collectives needs CUDA GPUs", file=sys.stderr)
        return 2
    command = command_line()
    if "RANK" in os.environ:  # torchrun
        _worker(int(os.environ["LOCAL_RANK"]), args, int(os.environ["WORLD_SIZE"]), command)
        return 0
    if args.nproc > torch.cuda.device_count():
        print(f"--nproc {args.nproc} needs a GPU per process, {torch.cuda.device_count()} visible: NCCL refuses two "
              "ranks on one GPU, and ranks sharing a GPU over gloo (shared_gpu) would time host copies, not a "
              "network", file=sys.stderr)
        return 2
    if args.nproc < 1:
        print(f"bench_collectives needs a GPU, found {args.nproc}", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    mp.spawn(_worker, args=(args, args.nproc, command), nprocs=args.nproc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
