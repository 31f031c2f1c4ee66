"""Documents and GPT-2 tokens of each part of the ``prose`` corpus (:func:`~composer_qsdp.recipes.data.prose_documents`)
on this machine: the distributions' descriptions, the documentation files, the prose of the ``*.py`` files and the
comments of the C/C++/CUDA files, deduplicated and in the order the build takes them, plus the docstrings alone (the
former ``docstrings`` corpus) for comparison. Tokens count each document's end-of-text token, before the split is cut
into samples.

``--shared-with MANIFEST`` also counts the part of each figure that comes from the standard library and from the
distributions a corpus manifest lists (``manifest.json`` of ``benchmarks/convergence.py``, or a convergence record
holding one): with the docstring tokens that host measured, the ratios estimate that host's yields::

    python tools/prose_yields.py
    python tools/prose_yields.py --shared-with benchmarks/results/2026-11-29_h200_ee91f25/convergence-gpt-125m-t512-b32-s2000.json

Parses every ``*.py`` file twice, in ``--workers`` processes: minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import multiprocessing
import os
import sys
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from composer_qsdp.recipes.data import sources
from composer_qsdp.recipes.data.tokenizer import gpt2_tokenizer

PARTS = ("descriptions", "documentation files", "python prose", "C/C++ comments")
DOCSTRINGS = "(docstrings alone)"


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _python(path: str) -> tuple[str, str] | None:
    text = _read(path)
    return None if text is None else (sources._python_file_prose(text), sources._docstring_prose(text))


def _c(path: str) -> str | None:
    text = _read(path)
    return None if text is None else sources._c_file_prose(text)


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-")


def shared_paths(manifest: dict, roots: list[Path]) -> Callable[[Path], bool]:
    """A test of whether a file belongs to the standard library or to a distribution named in ``manifest``."""
    named = {_normalized(d.split("==")[0]) for d in manifest["distributions"]}
    # the site directories: roots, and those inside a root (a standard library that holds its own site-packages)
    sites = [r for r in roots if r.name in ("site-packages", "dist-packages")]
    sites += [r / n for r in roots for n in ("site-packages", "dist-packages") if (r / n).is_dir()]
    owned: dict[Path, bool] = {}  # top-level folder or file of a site directory -> shared
    for site in sites:
        for dist in importlib.metadata.distributions(path=[str(site)]):
            shared = bool(dist.metadata["Name"]) and _normalized(dist.metadata["Name"]) in named
            for f in dist.files or []:
                parts = Path(str(f)).parts
                if parts and parts[0] != "..":
                    owned[site / parts[0]] = owned.get(site / parts[0], False) or shared

    def shared(path: Path) -> bool:
        for site in sites:
            if path.is_relative_to(site):
                return owned.get(site / path.relative_to(site).parts[0], False)
        # the standard library, less any site directory inside it
        return not any(part in ("site-packages", "dist-packages") for part in path.parts)

    return shared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", help="directory to read instead of the installed packages and standard library")
    parser.add_argument("--shared-with", metavar="MANIFEST", help="also count what comes from the distributions this "
                                                                  "corpus manifest (or convergence record) lists")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)
    roots = [Path(args.input)] if args.input else [Path(r) for r in sources.default_python_source_roots()]
    shared = None
    if args.shared_with:
        record = json.loads(Path(args.shared_with).read_text())
        shared = shared_paths(record.get("corpus") or record.get("manifest") or record, roots)
    (metadata, describe, _), (docs, document, _), (python, _, _), (c, _, _) = sources._prose_parts(roots)
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        python_texts = list(pool.map(_python, map(str, python), chunksize=64))
        c_texts = list(pool.map(_c, map(str, c), chunksize=64))
    documents = [
        ("descriptions", metadata, [describe(_read(str(p)) or "") for p in metadata]),
        ("documentation files", docs, [document(_read(str(p)) or "") for p in docs]),
        ("python prose", python, [t and t[0] for t in python_texts]),
        ("C/C++ comments", c, c_texts),
        (DOCSTRINGS, python, [t and t[1] for t in python_texts]),
    ]
    encode = gpt2_tokenizer().encode_ordinary
    tally: dict[str, Counter] = {}
    seen: set[bytes] = set()
    for part, files, texts in documents:
        counts = tally[part] = Counter()
        part_seen = set() if part == DOCSTRINGS else seen  # the corpus's parts share one set, as in the build
        for path, text in zip(files, texts):
            if not text or not text.strip():
                continue
            digest = sources._collapsed_digest(text)
            if digest in part_seen:
                continue
            part_seen.add(digest)
            tokens = len(encode(text)) + 1
            counts["documents"] += 1
            counts["tokens"] += tokens
            if shared is not None and shared(path):
                counts["shared documents"] += 1
                counts["shared tokens"] += tokens
    total = sum(tally[p]["tokens"] for p in PARTS)
    for part, counts in tally.items():
        line = f"{part:22s} {counts['documents']:7d} documents {counts['tokens']:11d} tokens"
        if shared is not None:
            line += f"; shared: {counts['shared documents']:7d} documents {counts['shared tokens']:11d} tokens"
        print(line)
    print(f"{'the prose corpus':22s} {sum(tally[p]['documents'] for p in PARTS):7d} documents {total:11d} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
