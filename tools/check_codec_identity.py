"""Check that this tree's codecs give bit-identical wires and decodes to those of an earlier commit.

A refactor of :mod:`composer_qsdp.quant` or :mod:`composer_qsdp.kernels` that claims "behaviour unchanged" runs
this against the commit before it::

    python tools/check_codec_identity.py ddf63fc                  # torch path, then the Triton interpreter path
    python tools/check_codec_identity.py ddf63fc --paths torch    # torch path only (a few minutes on 2 cores)

``composer_qsdp`` at ``REF`` is extracted with ``git archive`` into a temporary directory. The same case list
then runs in one subprocess per tree and path, each importing its own tree (``PYTHONPATH``), and every output
(``encode``, ``encode_rows``, ``decode``, ``decode_rows`` in the input dtype and in fp32, ``decode_sum``) is
compared by a digest of its bytes, so NaN payloads count too; an output that differs only in the payload of its
NaNs is reported apart (NaN payloads are unspecified: GPUs write the canonical NaN, and torch's CPU cast to bf16
writes 0xFFFF or 0x7FC0 depending on the memory layout it converts). The cases cover every registered codec and
mode, with and without the Hadamard rotation, every allowed bit width, bucket sizes that are and are not multiples
of 8 and powers of two (up to 2**20 elements, on tensors far smaller than one bucket), element counts with partial
buckets, fp32/bf16/fp16, 1-4 rows, several seeds and counter offsets, and inputs with NaN, infinities and ranges
that overflow fp32. The ``triton`` path runs the codecs under ``with backend("triton")`` with ``TRITON_INTERPRET=1``
(the kernels where they cover the configuration, the torch reference elsewhere): fewer cases, as the interpreter
is slow.

Exit status 0 when every output matches up to NaN payloads; the differing cases are listed.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (codec, options) pairs: every registered codec and the options that change what it computes. The learned
# codec's fit is shortened (its cost is per case) and, in one variant, subsampled with a stride.
VARIANTS = (
    ("minmax", {}),
    ("minmax", {"rounding": "nearest"}),
    ("random_shift", {}),
    ("learned", {"fit_steps": 3}),
    ("learned", {"fit_steps": 3, "fit_samples": 37}),
    ("symmetric", {}),
)
OUTPUTS = ("encode", "encode_rows", "decode", "decode_rows", "decode_rows(fp32)", "decode_sum")
SEEDS = ((0, 0), (1234567, 3), (2**62 + 5, 1_000_003), (7, 8))
KINDS = ("normal", "heavy", "constant", "nonfinite", "overflow")
DTYPES = ("float32", "bfloat16", "float16")


def _numels(bucket: int) -> tuple[int, ...]:
    """Element counts per row: one element, partial single buckets, whole buckets and partial last buckets."""
    if bucket >= 4096:
        return (1, 100, 4099)
    return tuple(sorted({1, 5, max(1, bucket - 1), bucket, bucket + 1, 2 * bucket + 3, 3 * bucket}))


def torch_cases() -> list[dict]:
    """The case list of the torch path."""
    buckets = (1, 3, 8, 24, 64, 100, 128, 1000, 1024, 4096, 2**16, 2**20)
    cases = []
    for (name, options), bucket in itertools.product(VARIANTS, buckets):
        bits_range = range(2, 9) if name == "symmetric" else range(1, 9)
        if bucket > 4096:  # the huge buckets cost the most (the reference pads a partial bucket): fewer widths
            bits_range = (2, 3, 8) if name == "symmetric" else (1, 3, 8)
        hadamards = (False, True) if bucket & (bucket - 1) == 0 and bucket <= 2**16 else (False,)
        repeats = range(2 if bucket < 4096 else 1)  # small buckets are cheap: two draws of rows, seed and input
        for bits, numel, dtype, hadamard, _ in itertools.product(bits_range, _numels(bucket), DTYPES, hadamards,
                                                                 repeats):  # fmt: skip
            i = len(cases)
            seed, offset = SEEDS[i % len(SEEDS)]
            cases.append({"codec": name, "options": options, "bits": bits, "bucket_size": bucket,
                          "hadamard": hadamard, "numel": numel, "rows": 1 + i % 4, "dtype": dtype,
                          "seed": seed, "offset": offset, "kind": KINDS[(i // 4) % len(KINDS)]})  # fmt: skip
    return cases


def triton_cases() -> list[dict]:
    """The case list of the Triton interpreter path: the configurations the kernels cover (min-max: bits 1, 2,
    4, 8; symmetric: 2, 4, 8, rotated too; buckets multiples of 8), a few that fall back to the reference."""
    configs = [("minmax", {}, bits, bucket, False) for bits in (1, 2, 4, 8) for bucket in (8, 24, 64, 1024)]
    configs += [("minmax", {"rounding": "nearest"}, bits, 64, False) for bits in (1, 4, 8)]
    configs += [("minmax", {}, 4, 64, True), ("minmax", {}, 3, 100, False)]
    configs += [("symmetric", {}, bits, bucket, had) for bits in (2, 4, 8) for bucket, had in
                ((8, False), (24, False), (64, False), (1024, False), (8, True), (64, True), (1024, True))]  # fmt: skip
    configs += [("symmetric", {}, 3, 64, True), ("symmetric", {}, 4, 100, False), ("random_shift", {}, 4, 64, True)]
    cases = []
    for name, options, bits, bucket, hadamard in configs:
        for numel in (5, bucket + 3, 3 * bucket):
            for dtype in DTYPES:
                i = len(cases)
                seed, offset = SEEDS[i % len(SEEDS)]
                cases.append({"codec": name, "options": options, "bits": bits, "bucket_size": bucket,
                              "hadamard": hadamard, "numel": numel, "rows": 1 + i % 4, "dtype": dtype,
                              "seed": seed, "offset": offset, "kind": KINDS[i % len(KINDS)]})  # fmt: skip
    return cases


def _input(case: dict, index: int):
    """The ``[rows, numel]`` input of a case, the same in every tree (a generator seeded by the case index)."""
    import torch

    gen = torch.Generator().manual_seed(index)
    shape = (case["rows"], case["numel"])
    kind = case["kind"]
    if kind == "constant":
        x = torch.full(shape, 0.3) + (torch.rand(shape, generator=gen) < 0.02)
    else:
        x = torch.randn(shape, generator=gen) * torch.exp(torch.randn(shape[0], 1, generator=gen))
        if kind == "heavy":
            x = x / torch.rand(shape, generator=gen).clamp_min(0.01)
    flat = x.view(-1)
    picks = torch.randint(0, flat.numel(), (3,), generator=gen)
    if kind == "nonfinite":
        flat[picks] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    elif kind == "overflow":  # finite values whose range overflows fp32 (not representable in fp16/bf16 alike)
        flat[picks[:2]] = torch.tensor([3e38, -3e38])
    return x.to(getattr(torch, case["dtype"]))


def _digests(t) -> tuple[str, str]:
    """Digests of the bytes of ``t``, and of ``t`` with every NaN replaced by the dtype's canonical NaN."""
    import torch

    def digest(u) -> str:
        data = u.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
        return f"{u.dtype}{tuple(u.shape)}:" + hashlib.blake2b(data, digest_size=16).hexdigest()

    t = t.contiguous()
    canonical = t.masked_fill(t.isnan(), float("nan")) if t.is_floating_point() else t
    return digest(t), digest(canonical)


def emit(path: str, out: Path) -> None:
    """Run the case list of ``path`` with the ``composer_qsdp`` on the import path and write the digests."""
    import torch

    import composer_qsdp
    from composer_qsdp.kernels import backend
    from composer_qsdp.quant import make_codec

    # The interpreter warns about the NaN and infinity arithmetic of the non-finite inputs, which is intended.
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    cases = torch_cases() if path == "torch" else triton_cases()
    digests = {"tree": str(Path(composer_qsdp.__file__).resolve().parents[1]), "cases": []}
    with backend(path):
        for i, case in enumerate(cases):
            x = _input(case, i)
            dtype = x.dtype
            n, seed, offset = case["numel"], case["seed"], case["offset"]
            codec = make_codec(case["codec"], bits=case["bits"], bucket_size=case["bucket_size"],
                               hadamard=case["hadamard"], **case["options"])  # fmt: skip
            wire = codec.encode(x[0], seed, offset)
            rows_wire = codec.encode_rows(x, seed, offset)
            outputs = [wire, rows_wire, codec.decode(wire, n, dtype), codec.decode_rows(rows_wire, n, dtype),
                       codec.decode_rows(rows_wire, n), codec.decode_sum(rows_wire, n)]  # fmt: skip
            digests["cases"].append([_digests(t) for t in outputs])
    out.write_text(json.dumps(digests))


def _extract(ref: str, dest: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "composer_qsdp"],
                             check=True, capture_output=True).stdout  # fmt: skip
    archive_path = dest / "ref.tar"
    archive_path.write_bytes(archive)
    with tarfile.open(archive_path) as tar:
        tar.extractall(dest, filter="data")


def _run(path: str, tree: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    env.pop("COMPOSER_QSDP_KERNELS", None)
    if path == "triton":
        env["TRITON_INTERPRET"] = "1"
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--emit", path, "--out", str(out)],
                            env=env)  # fmt: skip


def compare(ref: str, paths: list[str]) -> int:
    """Run ``paths`` on ``REF`` and on this tree, both trees at once; return the number of differing cases."""
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        ref_tree = Path(tmp) / "ref"
        ref_tree.mkdir()
        _extract(ref, ref_tree)
        for path in paths:
            outs = {"ref": Path(tmp) / f"{path}-ref.json", "new": Path(tmp) / f"{path}-new.json"}
            procs = [_run(path, ref_tree, outs["ref"]), _run(path, ROOT, outs["new"])]
            if any(p.wait() != 0 for p in procs):
                print(f"{path}: a case run failed (see above)")
                return -1
            old, new = (json.loads(outs[k].read_text()) for k in ("ref", "new"))
            assert Path(old["tree"]) == ref_tree.resolve() and Path(new["tree"]) == ROOT, (old["tree"], new["tree"])
            cases = torch_cases() if path == "torch" else triton_cases()
            assert len(old["cases"]) == len(new["cases"]) == len(cases)
            pairs = list(zip(old["cases"], new["cases"]))
            # Each output has two digests: its bytes, and its bytes with canonical NaNs.
            bad = [i for i, (a, b) in enumerate(pairs) if [d[1] for d in a] != [d[1] for d in b]]
            nan_payload = [i for i, (a, b) in enumerate(pairs) if a != b and i not in bad]
            for kind, indices in (("differs", bad), ("differs only in NaN payloads", nan_payload)):
                for i in indices[:20]:
                    outputs = [OUTPUTS[k] for k, (x, y) in enumerate(zip(*pairs[i])) if x != y]
                    print(f"{path} case {i} {kind} ({', '.join(outputs)}): {cases[i]}")
            same = len(cases) - len(bad) - len(nan_payload)
            print(f"{path}: {same} of {len(cases)} cases bit-identical in all {len(OUTPUTS)} outputs; "
                  f"{len(nan_payload)} differ only in NaN payloads; {len(bad)} differ")  # fmt: skip
            failures += len(bad)
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ref", nargs="?", help="git revision of the code to compare against, e.g. ddf63fc")
    parser.add_argument("--paths", nargs="+", choices=("torch", "triton"), default=["torch", "triton"])
    parser.add_argument("--emit", choices=("torch", "triton"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.emit:
        emit(args.emit, args.out)
        return
    if args.ref is None:
        parser.error("the revision to compare against (REF) is required")
    sys.exit(1 if compare(args.ref, args.paths) else 0)


if __name__ == "__main__":
    main()
