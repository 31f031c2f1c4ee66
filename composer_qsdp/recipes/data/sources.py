"""Text sources: each yields ``(split, document)`` pairs for the shard writer.

* :func:`text_directory_documents`: every ``*.txt`` file under a directory is one document.
* :func:`wikipedia_sample_documents`: the English Wikipedia sample bundled in the ``gensim`` wheel (the ``demo``
  extra; CC BY-SA 3.0; generated from the installed package, never stored in this repository).
* :func:`c4_documents`: C4 (``allenai/c4``) through Hugging Face ``datasets``, as the paper trained on;
  needs internet and the ``c4`` extra (``datasets``), so it is not exercised offline.
* :func:`python_source_documents`: the ``*.py`` files of the installed Python packages (``site-packages``) and
  of the standard library: a large offline corpus on any machine (torch's files alone give about 19 M GPT-2
  tokens). The text belongs to those packages under their own licenses: build shards on the machine that
  has them, never commit or redistribute the text.
* :func:`c_source_documents`: the C, C++ and CUDA sources and headers (``*.h``, ``*.cpp``, ``*.cuh``...) that the
  installed packages ship (torch's, CUDA's and Triton's headers among them): code of another language, offline.
* :func:`python_docstring_documents`: the docstrings of those ``*.py`` files, one document per file: English prose
  about code (what functions do, their arguments, references), a natural-language corpus large enough to train
  GPT-125M for thousands of steps without repeating a sample, on any machine. Same licenses and rules.

Sources without their own validation split assign each document to ``"train"`` or ``"val"`` by a hash of its
text (:func:`assign_split`), so a document never straddles the split and reruns give the same split.
"""

from __future__ import annotations

import ast
import bz2
import hashlib
import importlib
import importlib.util
import itertools
import multiprocessing
import os
import re
import site
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from composer_qsdp.validate import check_int

__all__ = [
    "C_SOURCE_PATTERNS",
    "MIN_DOCSTRING_CHARS",
    "TRAIN_SPLIT",
    "VAL_SPLIT",
    "assign_split",
    "c4_documents",
    "c_source_documents",
    "default_python_source_roots",
    "python_docstring_documents",
    "python_docstrings",
    "python_source_documents",
    "python_source_files",
    "source_files",
    "text_directory_documents",
    "wikipedia_sample_documents",
]

TRAIN_SPLIT = "train"
VAL_SPLIT = "val"

_WIKI_SAMPLE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
# Shorter pages are stubs and disambiguation lists: not prose worth training on.
_MIN_ARTICLE_CHARS = 200


def assign_split(text: str, val_fraction: float) -> str:
    """``"val"`` for a deterministic ``val_fraction`` of documents (by a hash of ``text``), else ``"train"``."""
    _check_val_fraction(val_fraction)
    return _split_of(hashlib.sha256(text.encode("utf-8")).digest(), val_fraction)


def _check_val_fraction(val_fraction: float) -> None:
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction!r} is invalid; it must be a number in [0, 1)")


def _split_of(digest: bytes, val_fraction: float) -> str:
    """The split of a document whose text has SHA-256 ``digest``: val when its first 8 bytes, as a fraction of
    2**64, fall below ``val_fraction``."""
    return VAL_SPLIT if int.from_bytes(digest[:8], "big") / 2**64 < val_fraction else TRAIN_SPLIT


def text_directory_documents(directory: str | os.PathLike, val_fraction: float) -> Iterator[tuple[str, str]]:
    """Each ``*.txt`` file under ``directory`` (recursively, sorted by path) as one UTF-8 document.

    Raises:
        ValueError: ``directory`` does not exist or holds no ``*.txt`` file.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"text directory {str(root)!r} does not exist or is not a directory")
    paths = sorted(root.rglob("*.txt"))
    if not paths:
        raise ValueError(f"text directory {str(root)!r} holds no *.txt files")
    for path in paths:
        text = path.read_text(encoding="utf-8")
        if text.strip():
            yield assign_split(text, val_fraction), text


def wikipedia_sample_documents(val_fraction: float) -> Iterator[tuple[str, str]]:
    """Articles of gensim's bundled English Wikipedia sample, as plain text (title, blank line, body).

    About 100 articles, 0.7 M GPT-2 tokens. The text is Wikipedia's, CC BY-SA 3.0.

    Raises:
        ImportError: ``gensim`` (the ``demo`` extra) is not installed.
    """
    _check_val_fraction(val_fraction)  # before the slow import
    try:
        wikicorpus = importlib.import_module("gensim.corpora.wikicorpus")
    except ImportError as err:
        raise ImportError("the Wikipedia sample ships inside gensim, which the demo extra installs: "
                          "pip install 'composer_qsdp[demo]'") from err
    gensim_dir = os.path.dirname(importlib.util.find_spec("gensim").origin)
    dump = os.path.join(gensim_dir, "test", "test_data", _WIKI_SAMPLE)
    with bz2.BZ2File(dump) as f:
        for title, markup, _ in wikicorpus.extract_pages(f):
            if markup.lower().startswith("#redirect"):
                continue
            # filter_wiki leaves bold/italic quote runs ('' and ''') in the text.
            body = re.sub(r"\n{3,}", "\n\n", re.sub(r"'{2,}", "", wikicorpus.filter_wiki(markup))).strip()
            if len(body) > _MIN_ARTICLE_CHARS:
                text = f"{title}\n\n{body}"
                yield assign_split(text, val_fraction), text


def c4_documents(val_documents: int, name: str = "en") -> Iterator[tuple[str, str]]:
    """C4 streamed from the Hugging Face Hub (``allenai/c4``; the paper trained on ``en``).

    Yields the first ``val_documents`` documents of C4's ``validation`` split as ``"val"``, then the ``train``
    split (365 M documents for ``en``) as ``"train"``; cap the total with ``max_documents`` of
    :func:`~composer_qsdp.recipes.data.shards.write_token_shards`.

    Raises:
        ImportError: ``datasets`` (the ``c4`` extra) is not installed.
    """
    if isinstance(val_documents, bool) or not isinstance(val_documents, int) or val_documents < 0:
        raise ValueError(f"val_documents={val_documents!r} is invalid; it must be an integer >= 0")
    try:
        datasets = importlib.import_module("datasets")
    except ImportError as err:
        raise ImportError("the C4 source needs Hugging Face datasets, which the c4 extra installs, and internet "
                          "access: pip install 'composer_qsdp[c4]'") from err
    validation = datasets.load_dataset("allenai/c4", name, split="validation", streaming=True)
    for row in itertools.islice(validation, val_documents):
        yield VAL_SPLIT, row["text"]
    for row in datasets.load_dataset("allenai/c4", name, split="train", streaming=True):
        yield TRAIN_SPLIT, row["text"]


def default_python_source_roots() -> list[str]:
    """The directories :func:`python_source_files` searches by default: this interpreter's
    ``site.getsitepackages()`` that exist (distributions list some that they never create) and its standard
    library (``sysconfig``'s ``stdlib`` path), which together hold every installed package's source."""
    roots = [*site.getsitepackages(), sysconfig.get_paths()["stdlib"]]
    return [r for r in dict.fromkeys(roots) if os.path.isdir(r)]


def python_source_files(roots: Sequence[str | os.PathLike] | None = None) -> list[Path]:
    """Every ``*.py`` file under ``roots``, in a deterministic order (:func:`source_files`)."""
    return source_files(("*.py",), roots)


#: The file patterns of :func:`c_source_documents`: C, C++ and CUDA sources and headers.
C_SOURCE_PATTERNS = ("*.c", "*.cc", "*.cpp", "*.cxx", "*.cu", "*.cuh", "*.h", "*.hh", "*.hpp", "*.hxx", "*.inl")


def source_files(patterns: Sequence[str], roots: Sequence[str | os.PathLike] | None = None) -> list[Path]:
    """Every file matching one of ``patterns`` (``Path.rglob`` patterns, e.g. ``"*.py"``) under ``roots``, in a
    deterministic order.

    Args:
        patterns: file name patterns, searched recursively.
        roots: directories to search recursively; None means :func:`default_python_source_roots`. Roots are
            taken in sorted order and the files of each in sorted path order; a file reached twice (overlapping
            roots, symbolic links, two patterns) is listed once, at its first position.

    Raises:
        ValueError: a given root is not a directory, or no matching file is found.
    """
    if roots is None:
        roots = default_python_source_roots()
    dirs = [Path(r) for r in roots]
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise ValueError(f"source root(s) {', '.join(map(repr, missing))} do not exist or are not directories")
    files: list[Path] = []
    seen: set[Path] = set()
    for root in sorted(dirs):
        for path in sorted({p for pattern in patterns for p in root.rglob(pattern)}):
            real = path.resolve()
            if real not in seen and real.is_file():
                seen.add(real)
                files.append(path)
    if not files:
        raise ValueError(f"no {' / '.join(patterns)} files under {', '.join(map(str, sorted(dirs)))}")
    return files


def python_source_documents(val_fraction: float,
                            roots: Sequence[str | os.PathLike] | None = None) -> Iterator[tuple[str, str]]:
    """Each Python source file of :func:`python_source_files` (default: the installed packages) as one document.

    Files that are empty, not UTF-8 (PEP 263 allows other encodings) or unreadable are skipped, and so is a file
    whose text equals an earlier one's (packages vendor identical copies): a repeated document would be
    training data seen twice and, through :func:`assign_split`, could never straddle train and val anyway.

    Raises:
        ValueError: ``val_fraction`` out of range, a root that is not a directory, or no ``*.py`` file.
    """
    _check_val_fraction(val_fraction)  # before the file walk
    return _file_documents(python_source_files(roots), val_fraction, lambda text: text)


def c_source_documents(val_fraction: float,
                       roots: Sequence[str | os.PathLike] | None = None) -> Iterator[tuple[str, str]]:
    """Each C, C++ or CUDA file (:data:`C_SOURCE_PATTERNS`) under ``roots`` (default: the installed packages) as
    one document, skipped and deduplicated as :func:`python_source_documents` does.

    Raises:
        ValueError: ``val_fraction`` out of range, a root that is not a directory, or no such file.
    """
    _check_val_fraction(val_fraction)
    return _file_documents(source_files(C_SOURCE_PATTERNS, roots), val_fraction, lambda text: text)


#: A file's docstrings shorter than this (characters, together) are left out: a one-line summary is not prose.
MIN_DOCSTRING_CHARS = 200


def python_docstrings(source: str) -> str:
    """The docstrings of a Python module's text (the module's, then every class's and function's, in source
    order), cleaned of their indentation (``inspect.cleandoc``) and joined by blank lines; ``""`` where the text
    does not parse or has none."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    nodes = [tree, *(n for n in ast.walk(tree)
                     if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    texts = (ast.get_docstring(n) for n in nodes)
    return "\n\n".join(t for t in texts if t and t.strip())


def python_docstring_documents(val_fraction: float, roots: Sequence[str | os.PathLike] | None = None,
                               workers: int | None = None) -> Iterator[tuple[str, str]]:
    """The docstrings of each Python source file of :func:`python_source_files` (:func:`python_docstrings`) as
    one document: natural-language text about code. Files whose docstrings hold fewer than
    :data:`MIN_DOCSTRING_CHARS` characters are skipped; otherwise as :func:`python_source_documents`.

    Parsing every file is the slow part (5-11 ms a file on one core here, some 47,000 files in a full environment), so
    ``workers`` processes parse them (default: every CPU this process may use, at most one per
    :data:`_FILES_PER_WORKER` files, as a spawned process takes seconds to start); the documents and their order are
    the same with any number.

    Raises:
        ValueError: ``val_fraction`` out of range, ``workers`` below 1, a root that is not a directory, or no
            ``*.py`` file.
    """
    _check_val_fraction(val_fraction)
    if workers is not None:
        check_int("workers", workers, minimum=1)
    files = python_source_files(roots)
    if workers is None:
        workers = max(1, min(len(os.sched_getaffinity(0)), len(files) // _FILES_PER_WORKER))
    return _file_documents(files, val_fraction, _docstring_prose, workers)


#: Files a worker process of :func:`python_docstring_documents` parses at least, by default: about 10 s of work, what a
#: spawned process takes to start here (it imports the package and torch).
_FILES_PER_WORKER = 2000


def _docstring_prose(text: str) -> str:
    """A file's docstrings (:func:`python_docstrings`), or ``""`` when they are shorter than
    :data:`MIN_DOCSTRING_CHARS`."""
    doc = python_docstrings(text)
    return doc if len(doc) >= MIN_DOCSTRING_CHARS else ""


def _file_text(path: Path, text_of: Callable[[str], str]) -> str | None:
    """``text_of`` the file's text, or ``None`` for a file that is unreadable or not UTF-8."""
    try:
        return text_of(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def _file_documents(files: list[Path], val_fraction: float, text_of: Callable[[str], str],
                    workers: int = 1) -> Iterator[tuple[str, str]]:
    """``(split, text_of(file's text))`` for each readable UTF-8 file whose document is not empty and not a repeat
    of an earlier one (packages vendor identical copies: a repeat would be seen twice, and could never straddle the
    split anyway), in file order; with ``workers`` > 1, ``text_of`` (a module-level function) runs in that many
    spawned processes."""
    if workers > 1:
        # spawned, not forked: the caller may hold threads (a tokenizer's) that a fork would copy mid-flight
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            texts: Iterable[str | None] = list(pool.map(_file_text, files, itertools.repeat(text_of), chunksize=64))
    else:  # one file at a time: a whole environment's sources need not be in memory at once
        texts = (_file_text(path, text_of) for path in files)
    seen: set[bytes] = set()
    for text in texts:
        if text is None:
            continue
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        if not text.strip() or digest in seen:
            continue
        seen.add(digest)
        yield _split_of(digest, val_fraction), text
