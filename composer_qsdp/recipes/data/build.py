"""Command line: build token MDS shards (``train`` and ``val``) from a text source, with GPT-2 BPE (the default) or a
local Hugging Face tokenizer directory (``--tokenizer DIR``: Llama's, GPT-NeoX's...; ``uint32`` ids past 2**16).

Examples::

    # the English Wikipedia sample bundled in gensim (the demo extra; offline, ~0.7 M tokens, CC BY-SA 3.0)
    python -m composer_qsdp.recipes.data.build wikipedia data/wiki-gpt2-t64 --seq-len 64 --skip-existing
    # any directory of *.txt files
    python -m composer_qsdp.recipes.data.build textdir data/mytext-t2048 --input ~/corpus --seq-len 2048
    # the *.py files of the installed Python packages and the standard library (offline; the text stays on this
    # machine, never commit it)
    python -m composer_qsdp.recipes.data.build pysource data/pysource-gpt2-t512 --seq-len 512 --val-fraction 0.02
    # the C/C++/CUDA sources and headers of the installed packages, and their English prose (package descriptions,
    # documentation files, the docstrings, comments and messages of their *.py files, the comments of their C/C++
    # files): two more offline corpora of other kinds, for the convergence protocol; --min-train-tokens fails the
    # build (exit 2) when the text falls short of a run
    python -m composer_qsdp.recipes.data.build csource data/csource-gpt2-t512 --seq-len 512 --val-fraction 0.02
    python -m composer_qsdp.recipes.data.build prose data/prose-gpt2-t512 --seq-len 512 --val-fraction 0.02 \
        --max-train-tokens 40000000 --min-train-tokens 32768000
    # C4 as in the paper (internet + the c4 extra); upload the result and point data.remote at it
    python -m composer_qsdp.recipes.data.build c4 data/c4-gpt2-t2048 --seq-len 2048 --max-documents 2000000
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence

from composer_qsdp.recipes.data.shards import shards_exist, write_token_shards
from composer_qsdp.recipes.data.sources import (
    TRAIN_SPLIT,
    c4_documents,
    c_source_documents,
    prose_documents,
    python_source_documents,
    text_directory_documents,
    wikipedia_sample_documents,
)

__all__ = ["SOURCES", "main"]

#: The text sources, as the command line names them.
SOURCES = ("wikipedia", "textdir", "pysource", "csource", "prose", "c4")


def _documents(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    if args.source == "wikipedia":
        return wikipedia_sample_documents(args.val_fraction)
    if args.source == "textdir":
        if args.input is None:
            raise ValueError("source 'textdir' needs --input DIR (a directory of *.txt files)")
        return text_directory_documents(args.input, args.val_fraction)
    code_sources = {"pysource": python_source_documents, "csource": c_source_documents, "prose": prose_documents}
    if args.source in code_sources:
        return code_sources[args.source](args.val_fraction, None if args.input is None else [args.input])
    return c4_documents(args.c4_val_documents, name=args.c4_name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m composer_qsdp.recipes.data.build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", choices=SOURCES,
                        help="where the text comes from")
    parser.add_argument("out_dir", help="directory to create, holding train/ and val/ shards")
    parser.add_argument("--seq-len", type=int, required=True, help="tokens per sample (the model's max_seq_len)")
    parser.add_argument("--input", help="textdir: directory searched recursively for *.txt files; pysource: for "
                                        "*.py files; csource: for C/C++/CUDA files; prose: for both, "
                                        "*.dist-info/METADATA and *.md/*.rst/*.txt documentation (default: the "
                                        "installed packages and the standard library)")
    parser.add_argument("--val-fraction", type=float, default=0.05,
                        help="every source but c4: fraction of documents (by text hash) held out for val")
    parser.add_argument("--c4-name", default="en", help="c4: dataset configuration (the paper used 'en')")
    parser.add_argument("--c4-val-documents", type=int, default=10_000,
                        help="c4: documents taken from C4's validation split")
    parser.add_argument("--max-documents", type=int, help="stop after this many documents in total")
    parser.add_argument("--max-train-tokens", type=int,
                        help="stop once the train split holds this many tokens (a smaller corpus to carry)")
    parser.add_argument("--min-train-tokens", type=int,
                        help="fail (exit 2, the shards kept) when the train split holds fewer tokens than this: the "
                             "tokens a run trains on without repeating a sample (steps x global batch x seq len)")
    parser.add_argument("--tokenizer", default="gpt2",
                        help="'gpt2' (offline GPT-2 BPE, the default) or a local Hugging Face tokenizer directory "
                             "(AutoTokenizer, the hf extra; nothing is downloaded)")
    parser.add_argument("--skip-existing", action="store_true",
                        help="exit successfully, building nothing, when out_dir already holds finished shards")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = _parser().parse_args(argv)
    if args.skip_existing and shards_exist(args.out_dir):
        print(f"shards already built in {args.out_dir}; nothing to do")
        return 0
    try:
        stats = write_token_shards(_documents(args), args.out_dir, args.seq_len,
                                   max_documents=args.max_documents,
                                   max_train_tokens=args.max_train_tokens, progress=True, tokenizer=args.tokenizer)
    except (ValueError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for split, s in stats.items():
        print(f"{split}: {s.documents} documents -> {s.samples} samples of {args.seq_len} tokens "
              f"({s.samples * args.seq_len} tokens; {s.dropped_tokens} tail tokens dropped)")
    empty = [split for split, s in stats.items() if s.samples == 0]
    if empty:
        print(f"error: split(s) {', '.join(empty)} received no full sample; use more text, a shorter --seq-len "
              "or another --val-fraction", file=sys.stderr)
        return 2
    train_tokens = stats[TRAIN_SPLIT].samples * args.seq_len
    if args.min_train_tokens is not None and train_tokens < args.min_train_tokens:
        print(f"error: the train split holds {train_tokens} tokens, fewer than --min-train-tokens "
              f"{args.min_train_tokens}; use more text (another source or --input) or a smaller run "
              f"(shards left in {args.out_dir})", file=sys.stderr)
        return 2
    if args.max_train_tokens is not None and train_tokens < args.max_train_tokens:
        print(f"note: the text ran out at {train_tokens} train tokens, before --max-train-tokens "
              f"{args.max_train_tokens}")
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
