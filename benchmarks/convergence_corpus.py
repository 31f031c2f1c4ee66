"""The convergence driver's corpus: building the offline text corpora of the protocol (:data:`CORPORA`) as GPT-2
token shards with a manifest that fingerprints their input, reading the manifest of shards built elsewhere, and
checking that a run's steps never repeat a sample.

The manifest (``<corpus>/manifest.json``) records the exact build command, the interpreter, every installed
distribution and a SHA-256 over the input files' relative paths and contents, so the same corpus can be rebuilt and
checked; a corpus is never rebuilt over one built from other text or with another split.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import e2e_common as common


def split_samples(corpus: Path, split: str) -> int:
    """Samples in one split of an MDS shard directory (from its ``index.json``)."""
    index = common.read_json(corpus / split / "index.json")
    return sum(shard["samples"] for shard in index["shards"])


#: ``--corpus-kind``: the offline corpora of the protocol, three kinds of text, with what each build reads.
CORPORA: dict[str, str] = {
    "pysource": "every *.py file of the installed Python packages and the standard library",
    "csource": "every C, C++ and CUDA source and header file of the installed Python packages",
    "prose": "English prose about the installed Python packages and the standard library: the distributions' "
             "descriptions (METADATA), their documentation files (*.md, *.rst, *.txt; no license texts, test "
             "fixtures or data), the docstrings, comments and messages of every *.py file and the comments of "
             "their C/C++/CUDA files",
}


def source_fingerprint(kind: str, roots: list[str] | None) -> dict[str, Any]:
    """Files, bytes and a SHA-256 over (path relative to its root, SHA-256 of the content) of every file the
    ``kind`` build reads, in its order: equal fingerprints mean equal input text."""
    from composer_qsdp.recipes.data import default_python_source_roots, source_files
    from composer_qsdp.recipes.data.sources import C_SOURCE_PATTERNS, prose_source_files

    if roots is None:
        roots = default_python_source_roots()
    dirs = sorted(Path(r).resolve() for r in roots)
    digest, total = hashlib.sha256(), 0
    files = (prose_source_files(dirs) if kind == "prose" else
             source_files(C_SOURCE_PATTERNS if kind == "csource" else ("*.py",), dirs))
    for path in files:
        data = path.read_bytes()
        total += len(data)
        root = next(d for d in dirs if path.is_relative_to(d))
        digest.update(f"{path.relative_to(root)}\0".encode() + hashlib.sha256(data).digest())
    return {"roots": [str(d) for d in dirs], "files": len(files), "bytes": total, "sha256": digest.hexdigest()}


def build_corpus(corpus: Path, seq_len: int, val_fraction: float, inputs: str | None,
                 max_documents: int | None, max_train_tokens: int | None = None,
                 kind: str = "pysource") -> dict[str, Any]:
    """Build the ``kind`` shards (:data:`CORPORA`) at ``corpus`` unless present; returns its manifest (written
    beside them).

    Raises:
        SystemExit: the build failed (its log is named), an existing corpus was built from another kind or with
            another ``val_fraction``, or ``corpus`` exists without the manifest this function writes.
    """
    manifest_path = corpus / "manifest.json"
    if manifest_path.is_file():
        manifest = common.read_json(manifest_path)
        built = manifest.get("kind", "pysource")
        if manifest["val_fraction"] != val_fraction or manifest["seq_len"] != seq_len or built != kind:
            raise SystemExit(f"corpus {corpus} was built from {built} with val_fraction={manifest['val_fraction']}, "
                             f"seq_len={manifest['seq_len']}; pass those, or another --corpus")
        return manifest
    if corpus.exists():
        raise SystemExit(f"{corpus} exists but has no manifest.json (not built by this driver, or its build was "
                         "interrupted): remove it, or pass another --corpus")
    command = [sys.executable, "-m", "composer_qsdp.recipes.data.build", kind, str(corpus), "--seq-len",
               str(seq_len), "--val-fraction", str(val_fraction)]
    command += ["--input", inputs] if inputs else []
    command += ["--max-documents", str(max_documents)] if max_documents else []
    command += ["--max-train-tokens", str(max_train_tokens)] if max_train_tokens else []
    log = corpus.with_name(corpus.name + ".build.log")
    print(f"building the corpus: {' '.join(command)} (log: {log})", flush=True)
    t0 = time.monotonic()
    if common.run(command, log, os.environ, common.Budget(None)) != 0:
        raise SystemExit(f"corpus build failed; see {log}:\n{common.log_tail(log, 2000)}")
    manifest = {
        "kind": kind,
        "source": f"{kind}: {CORPORA[kind]} (sorted paths, exact duplicates dropped), GPT-2 BPE, documents split by "
                  "text hash",
        "command": " ".join(["python", *command[1:]]),
        "python": platform.python_version(),
        "seq_len": seq_len,
        "val_fraction": val_fraction,
        "max_documents": max_documents,
        "max_train_tokens": max_train_tokens,
        "input": source_fingerprint(kind, None if inputs is None else [inputs]),
        "samples": {split: split_samples(corpus, split) for split in ("train", "val")},
        "build_seconds": round(time.monotonic() - t0, 1),
        "distributions": sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                                 if d.metadata["Name"]}),
        "license": "the text of the installed packages, under their own licenses: kept on this machine, "
                   "never committed",
    }
    manifest["tokens"] = {split: n * seq_len for split, n in manifest["samples"].items()}
    common.write_json(manifest_path, manifest)
    return manifest


def prebuilt_corpus(corpus: Path, seq_len: int) -> dict[str, Any]:
    """The manifest of shards built elsewhere by this driver (``--build-only``, then carried: ``--data``).

    Raises:
        SystemExit: no ``manifest.json`` or ``train``/``val`` index there, or shards of another sequence length.
    """
    manifest_path = corpus / "manifest.json"
    missing = [p for p in (manifest_path, corpus / "train" / "index.json", corpus / "val" / "index.json")
               if not p.is_file()]
    if missing:
        raise SystemExit(f"--data {corpus}: {', '.join(map(str, missing))} missing; build the corpus with "
                         "'python benchmarks/convergence.py --build-only --corpus DIR' and carry the whole DIR")
    manifest = common.read_json(manifest_path)
    if manifest["seq_len"] != seq_len:
        raise SystemExit(f"--data {corpus} holds samples of {manifest['seq_len']} tokens; pass --seq-len "
                         f"{manifest['seq_len']} or another corpus")
    return manifest


def check_corpus(manifest: dict[str, Any], steps: int, global_batch: int) -> None:
    """Raise SystemExit unless the corpus of ``manifest`` holds a train sample for each of ``steps`` x
    ``global_batch`` (no sample repeats) and some validation samples: the check before any arm runs, and the end
    of ``--build-only``, so a script that chains ``--build-only && <the run>`` stops at the build."""
    need = steps * global_batch
    have = manifest["samples"]["train"]
    if have < need:
        raise SystemExit(f"the corpus has {have} train samples but {steps} steps x {global_batch} "
                         f"= {need} are needed so that no sample repeats; lower --steps/--global-batch/--seq-len or "
                         "give more text (--corpus-input)")
    if manifest["samples"]["val"] == 0:
        raise SystemExit("the corpus has no validation samples; raise --val-fraction")
