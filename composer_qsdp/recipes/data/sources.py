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
* :func:`prose_documents`: the natural-language corpus about the installed software: the long descriptions of the
  installed distributions (their ``METADATA``: a package's README), their documentation files (``*.md``, ``*.rst``,
  ``*.txt``: no license texts, packaging records, test fixtures or data), each ``*.py`` file's docstrings, prose
  comments and messages, and the prose comments of the C/C++/CUDA files. The docstrings alone fall short of a
  GPT-125M seed run (2,000 steps x 32 x 512 tokens) on a torch environment; the comments and messages are there
  for size. Same licenses and rules.

Sources without their own validation split assign each document to ``"train"`` or ``"val"`` by a hash of its
text (:func:`assign_split`; :func:`prose_documents` hashes the text with its whitespace collapsed), so a document
never straddles the split and reruns give the same split.
"""

from __future__ import annotations

import ast
import bz2
import email.parser
import fnmatch
import functools
import hashlib
import importlib
import importlib.util
import itertools
import multiprocessing
import os
import re
import site
import sysconfig
import textwrap
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from composer_qsdp.validate import check_int

__all__ = [
    "C_SOURCE_PATTERNS",
    "DOC_FILE_PATTERNS",
    "MIN_PROSE_CHARS",
    "MIN_STRING_WORDS",
    "TRAIN_SPLIT",
    "VAL_SPLIT",
    "assign_split",
    "c4_documents",
    "c_comments",
    "c_source_documents",
    "default_python_source_roots",
    "documentation_files",
    "is_prose",
    "package_description",
    "package_metadata_files",
    "prose_documents",
    "prose_source_files",
    "python_comments",
    "python_docstrings",
    "python_prose",
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
    """Every file matching one of ``patterns`` (file name patterns, e.g. ``"*.py"``) under ``roots``, in a
    deterministic order.

    Args:
        patterns: file name patterns (``fnmatch``, case-sensitive), searched recursively.
        roots: directories to search recursively; None means :func:`default_python_source_roots`. Roots are
            taken in sorted order and the files of each in sorted path order; a file reached twice (overlapping
            roots, symbolic links, two patterns) is listed once, at its first position.

    Raises:
        ValueError: a given root is not a directory, or no matching file is found.
    """
    files, dirs = _matching_files(patterns, roots)
    if not files:
        raise ValueError(f"no {' / '.join(patterns)} files under {', '.join(map(str, dirs))}")
    return files


def _matching_files(patterns: Sequence[str], roots: Sequence[str | os.PathLike] | None,
                    keep: Callable[[Path], bool] | None = None) -> tuple[list[Path], list[Path]]:
    """:func:`source_files`'s files (possibly none) whose path relative to their root passes ``keep``, and the
    sorted roots. One walk of each root, whatever the number of patterns.

    Raises:
        ValueError: a given root is not a directory.
    """
    if roots is None:
        roots = default_python_source_roots()
    dirs = sorted(Path(r) for r in roots)
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise ValueError(f"source root(s) {', '.join(map(repr, missing))} do not exist or are not directories")
    # fnmatchcase's patterns as one regular expression, matched against bare names: the walk meets every name of
    # the installed packages (over a million), and a Path object for each took more than half of the walk's time.
    match = re.compile("|".join(fnmatch.translate(pattern) for pattern in patterns)).match
    files: list[Path] = []
    seen: set[Path] = set()
    for root in dirs:
        # Path.rglob("*")'s entries: every name under every directory reached without following a symbolic link.
        matches = sorted(Path(top, name) for top, subdirs, names in os.walk(root)
                         for name in itertools.chain(subdirs, names) if match(name))
        for path in matches:
            if keep is not None and not keep(path.relative_to(root)):
                continue
            real = path.resolve()
            if real not in seen and real.is_file():
                seen.add(real)
                files.append(path)
    return files, dirs


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


def _parse(source: str) -> ast.Module | None:
    """The syntax tree of ``source``, or None where it does not parse; quiet (old files' invalid escapes, a
    comment's ``2nd``: no ``SyntaxWarning`` on stderr)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        try:
            return ast.parse(source)
        except (SyntaxError, ValueError):
            return None


def _utf8(text: str) -> str:
    """``text`` with each lone surrogate (a ``"\\udc80"`` escape in a literal: ``ast`` keeps it, UTF-8 cannot
    encode it, and the hash and the tokenizer would fail on it) replaced by ``?``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def python_docstrings(source: str) -> str:
    """The docstrings of a Python module's text (the module's, then every class's and function's, in source
    order), cleaned of their indentation (``inspect.cleandoc``) and joined by blank lines; ``""`` where the text
    does not parse or has none."""
    tree = _parse(source)
    if tree is None:
        return ""
    return _utf8("\n\n".join(doc for statement, doc in sorted(_docstrings(tree), key=lambda d: d[0].lineno)))


def _docstrings(tree: ast.Module) -> list[tuple[ast.Expr, str]]:
    """Each docstring of ``tree`` that is not blank, with its statement: the module's, then every class's and
    function's (walk order), cleaned of their indentation (``ast.get_docstring``)."""
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))]
    found = [(node, ast.get_docstring(node)) for node in nodes]
    return [(node.body[0], doc) for node, doc in found if doc and doc.strip()]


def _parse_workers(workers: int | None, files: int) -> int:
    """The processes that read ``files`` files: ``workers``, checked, or by default every CPU this process may use,
    at most one per :data:`_FILES_PER_WORKER` files (a spawned process takes seconds to start). Parsing the
    ``*.py`` files is the slow part of :func:`prose_documents` (some 47,000 in a full environment)."""
    if workers is not None:
        return check_int("workers", workers, minimum=1)
    return max(1, min(len(os.sched_getaffinity(0)), files // _FILES_PER_WORKER))


#: Files a worker process of :func:`prose_documents` parses at least, by default: about 10 s of work, what a spawned
#: process takes to start here (it imports the package and torch).
_FILES_PER_WORKER = 2000


#: A prose document (:func:`prose_documents`) shorter than this (characters) is left out: too little to be prose (a
#: one-line summary, a short note).
MIN_PROSE_CHARS = 200

#: The documentation file patterns of :func:`documentation_files`.
DOC_FILE_PATTERNS = ("*.md", "*.rst", "*.txt")

#: A documentation file or package description is prose (:func:`is_prose`) when at least this fraction of its
#: whitespace-separated words are English function words (:data:`_FUNCTION_WORDS`): READMEs and guides hold 20-35%,
#: while tables of numbers, word lists, grammars, requirement lists and command output hold almost none.
MIN_FUNCTION_WORD_FRACTION = 0.15

_FUNCTION_WORDS = frozenset(
    "a an the of to in on for and or is are be was were it its this that these those with as by from at not no can "
    "if when which will may should must".split())

#: Names of legal texts (matched anywhere in a file name, any case): license, notice, copyright, authorship files.
_LEGAL_NAME = re.compile(r"licen[cs]e|copying|copyright|notice|authors|contributors|patents|third.?party", re.I)
#: Folders whose files are no documentation: test fixtures and data, and the legal texts of a ``*.dist-info``.
_SKIPPED_DIRS = frozenset({"test", "tests", "testing", "test_data", "testdata", "licenses", "license_files"})
#: Documentation-patterned files that are build or packaging data.
_DATA_NAME = re.compile(r"requirements.*|constraints.*|cmakelists\.txt|.*\.in\.txt", re.I)
#: Metadata files with a package's long description, by the suffix of the folder that holds them.
_METADATA_DIRS = {"METADATA": ".dist-info", "PKG-INFO": ".egg-info"}


def is_prose(text: str) -> bool:
    """Whether ``text`` reads as English prose: at least :data:`MIN_FUNCTION_WORD_FRACTION` of its
    whitespace-separated words are English function words ("the", "of", "is"...)."""
    words = text.split()
    return bool(words) and sum(w.lower() in _FUNCTION_WORDS for w in words) >= MIN_FUNCTION_WORD_FRACTION * len(words)


def _is_documentation(rel: Path) -> bool:
    """Whether the file at ``rel`` (relative to its root) may be documentation: not a legal text, not in a test or
    license folder, not packaging metadata (a ``*.dist-info`` or ``*.egg-info`` folder's files), not build data."""
    folders = rel.parts[:-1]
    return not (_LEGAL_NAME.search(rel.name) or _DATA_NAME.fullmatch(rel.name)
                or any(f.lower() in _SKIPPED_DIRS or f.endswith((".dist-info", ".egg-info")) for f in folders))


def documentation_files(roots: Sequence[str | os.PathLike] | None = None) -> list[Path]:
    """The documentation files (:data:`DOC_FILE_PATTERNS`) under ``roots`` (default: the installed packages and the
    standard library), in :func:`source_files`' order, less those that are no documentation by their name or place:
    legal texts (``LICENSE*``, ``COPYING``, ``NOTICE``, ``AUTHORS``, third-party notices: a few standard texts
    repeated in hundreds of packages with other names and years, which exact deduplication cannot catch, so their
    near-copies would sit in both train and val), files in ``test``/``tests``/``testing``/``test_data`` or
    ``licenses`` folders (fixtures and legal texts), every file of a ``*.dist-info`` or ``*.egg-info`` folder
    (``RECORD``, ``entry_points.txt``, ``top_level.txt``...: packaging records; their descriptions come from
    :func:`package_metadata_files`), requirement and constraint lists and ``CMakeLists.txt``. Possibly none.

    Raises:
        ValueError: a given root is not a directory.
    """
    return _matching_files(DOC_FILE_PATTERNS, roots, _is_documentation)[0]


def package_metadata_files(roots: Sequence[str | os.PathLike] | None = None) -> list[Path]:
    """The ``METADATA`` files of the ``*.dist-info`` folders and the ``PKG-INFO`` files of the ``*.egg-info`` folders
    under ``roots`` (default: the installed packages and the standard library), in :func:`source_files`' order:
    one per installed distribution, holding its long description (:func:`package_description`). Possibly none.

    Raises:
        ValueError: a given root is not a directory.
    """
    def in_metadata_dir(rel: Path) -> bool:
        return len(rel.parts) > 1 and rel.parts[-2].endswith(_METADATA_DIRS[rel.name])

    return _matching_files(tuple(_METADATA_DIRS), roots, in_metadata_dir)[0]


def package_description(metadata: str) -> str:
    """The long description of a distribution (usually its README) from the text of its ``METADATA`` or
    ``PKG-INFO`` (core metadata: e-mail style headers, then the description as the body; versions before 2.1 put
    it in a ``Description`` header, whose continuation lines are indented, some with ``|``); ``""`` when it has none
    (``UNKNOWN``)."""
    message = email.parser.Parser().parsestr(metadata)
    body = message.get_payload()
    text = body if isinstance(body, str) else ""
    if not text.strip():
        header = message.get("Description") or ""
        first, _, rest = str(header).partition("\n")
        text = first + "\n" + re.sub(r"(?m)^(?: {8}| {7}\|)", "", rest) if rest else first
    text = text.strip()
    return "" if text.upper() == "UNKNOWN" else text


#: Comment lines that are directives to tools, not prose.
_DIRECTIVE = re.compile(r"!|\s*(?:-\*-|(?:type|fmt|pylint|mypy|isort|pyright|ruff|yapf|flake8|coding|vim?|pyre-\w+)"
                        r"\s*[:=]|(?:noqa|nosec|nolint|pragma)\b)", re.I)
#: A comment block naming a license or copyright: a file's legal header, the same in thousands of files.
_LEGAL_TEXT = re.compile(r"copyright|\blicen[cs]|spdx", re.I)
_TWO_WORDS = re.compile(r"[A-Za-z]{2,}[,;:]? +[A-Za-z]{2,}")
_COMMENT_LINE = re.compile(r"[ \t]*#(.*)")


def _comment_blocks(source: str, tree: ast.AST) -> list[tuple[int, str]]:
    """``(first line, text)`` of each prose comment block of a parsed module: runs of consecutive whole-line ``#``
    comments (not inline ones, not lines inside multi-line strings), their ``#`` marks and common indentation
    removed, less directives to tools (``noqa``, ``type:``, ``pragma``...), and kept only when the block names no
    license or copyright (a file's legal header), holds two words in a row and does not parse as Python
    (commented-out code)."""
    in_strings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and node.end_lineno and node.end_lineno > node.lineno:
            in_strings.update(range(node.lineno + 1, node.end_lineno + 1))
    blocks: list[tuple[int, list[str]]] = []
    last = -1
    for number, line in enumerate(source.splitlines(), 1):
        match = _COMMENT_LINE.fullmatch(line)
        if match is None or number in in_strings:
            continue
        text = match.group(1).lstrip("#")
        if _DIRECTIVE.match(text):
            continue
        if number != last + 1:
            blocks.append((number, []))
        blocks[-1][1].append(text.rstrip())
        last = number
    kept = []
    for number, lines in blocks:
        text = textwrap.dedent("\n".join(lines)).strip()
        if not _TWO_WORDS.search(text) or _LEGAL_TEXT.search(text) or _parse(text) is not None:
            continue
        kept.append((number, text))
    return kept


def python_comments(source: str) -> str:
    """The prose comment blocks of a Python module's text (:func:`_comment_blocks`) in source order, joined by blank
    lines; ``""`` where the text does not parse or has none."""
    tree = _parse(source)
    if tree is None:
        return ""
    return "\n\n".join(text for _, text in _comment_blocks(source, tree))


def python_prose(source: str) -> str:
    """The prose of a Python module's text, in source order, joined by blank lines: its docstrings (as
    :func:`python_docstrings` takes them), its prose comment blocks (:func:`python_comments`) and its prose strings
    (:func:`_prose_strings`: error messages, warnings, help texts); ``""`` where the text does not parse or has
    none."""
    tree = _parse(source)
    if tree is None:
        return ""
    docstrings = _docstrings(tree)
    pieces = _comment_blocks(source, tree) + [(statement.lineno, doc) for statement, doc in docstrings]
    pieces += _prose_strings(tree, {id(statement.value) for statement, _ in docstrings})
    return _utf8("\n\n".join(text for _, text in sorted(pieces, key=lambda piece: piece[0])))


#: A string literal of fewer words (two letters or more) than this is no message.
MIN_STRING_WORDS = 4
_WORD = re.compile(r"[A-Za-z]{2,}")


def _prose_strings(tree: ast.AST, skipped: set[int]) -> list[tuple[int, str]]:
    """``(line, text)`` of each string literal of a parsed module, other than the nodes in ``skipped`` (the
    docstrings), that reads as prose: at least :data:`MIN_STRING_WORDS` words and :func:`is_prose` (error and
    warning messages, help texts; not code templates, names or format strings). An f-string counts as its literal
    parts with ``{}`` for each replacement field."""
    parts_of_fstrings: set[int] = set()
    strings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts_of_fstrings.update(id(v) for v in node.values)
            text = "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                           for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            text = node.value
        else:
            continue
        strings.append((node, text))
    return [(node.lineno, text.strip()) for node, text in strings
            if id(node) not in parts_of_fstrings and len(_WORD.findall(text)) >= MIN_STRING_WORDS
            and is_prose(text.replace("{}", ""))]


#: A C/C++ comment, or a string or character literal (which may hold comment marks).
_C_TOKEN = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
_C_CODE_LINE = re.compile(r".*[;{}]\s*$|\s*#\s*\w")


def c_comments(source: str) -> str:
    """The prose comments of a C, C++ or CUDA file's text, in source order, joined by blank lines: each ``/* */``
    comment and each run of ``//`` comments alone on consecutive lines, without their marks (``/**``, ``*`` at line
    starts, ``///``, ``//!``) and common indentation, kept when it names no license or copyright, holds two words in
    a row and at most half of its lines look like code (ending in ``;``, ``{`` or ``}``, or a preprocessor line)."""
    blocks: list[list[str]] = []
    last_line = -2  # the line of the last // comment
    for match in _C_TOKEN.finditer(source):
        token = match.group(0)
        if token[0] in "\"'":
            continue
        line = source.count("\n", 0, match.start())
        if token.startswith("//"):
            text = token[2:].lstrip("/!")
            alone = not source[source.rfind("\n", 0, match.start()) + 1:match.start()].strip()  # no code before
            if alone and line == last_line + 1 and blocks and blocks[-1] is not None:
                blocks[-1].append(text)
            else:
                blocks.append([text])
            last_line = line if alone else -2
        else:
            lines = token[2:-2].lstrip("*!").split("\n")
            blocks.append([lines[0], *(re.sub(r"^\s*\*+(?!/)", "", x) for x in lines[1:])])
            blocks.append(None)  # a // comment after a /* */ one starts a new block
            last_line = -2
    kept = []
    for lines in blocks:
        if lines is None:
            continue
        text = textwrap.dedent("\n".join(x.rstrip() for x in lines)).strip()
        code = sum(bool(_C_CODE_LINE.match(x)) for x in text.splitlines() if x.strip())
        if _TWO_WORDS.search(text) and not _LEGAL_TEXT.search(text) and 2 * code <= len(text.splitlines()):
            kept.append(text)
    return "\n\n".join(kept)


def prose_source_files(roots: Sequence[str | os.PathLike] | None = None) -> list[Path]:
    """Every file :func:`prose_documents` reads, in its order: :func:`package_metadata_files`,
    :func:`documentation_files`, :func:`python_source_files`, then the C, C++ and CUDA files
    (:data:`C_SOURCE_PATTERNS`).

    Raises:
        ValueError: a given root is not a directory, or it holds no ``*.py`` file.
    """
    return [path for files, _ in _prose_parts(roots) for path in files]


def _prose_parts(roots: Sequence[str | os.PathLike] | None) -> list[tuple[list[Path], Callable[[str], str]]]:
    """The parts of :func:`prose_documents`, in its order: each one's files, and what takes a file's text to its
    document (a module-level callable, for worker processes)."""
    return [(package_metadata_files(roots), _description_prose),
            (documentation_files(roots), _long_prose),
            (python_source_files(roots), _python_file_prose),
            (_matching_files(C_SOURCE_PATTERNS, roots)[0], _c_file_prose)]


def prose_documents(val_fraction: float, roots: Sequence[str | os.PathLike] | None = None,
                    workers: int | None = None) -> Iterator[tuple[str, str]]:
    """The English prose about the software under ``roots`` (default: the installed packages and the standard
    library), one document per file, in this order:

    1. the long description of each installed distribution (:func:`package_metadata_files`,
       :func:`package_description`): its README;
    2. the documentation files (:func:`documentation_files`: ``*.md``, ``*.rst``, ``*.txt``, without legal texts,
       packaging records, test fixtures, requirement lists);
    3. the prose of each ``*.py`` file (:func:`python_prose`): its docstrings, its prose comments and its prose
       string literals (messages, help texts), in source order;
    4. the prose comments of each C, C++ or CUDA file (:func:`c_comments`; the headers' API documentation).

    Parts 1-2 and the docstrings are the prose proper; the comments, the messages and part 4 are there for size. On
    the GPU host's torch environment (25,700 ``*.py`` files) the docstrings alone gave 21.9 M GPT-2 train tokens,
    short of the 32.8 M a GPT-125M seed run trains on (2,000 steps x 32 samples x 512 tokens, no sample twice); the
    whole corpus gave 39.9 M (``benchmarks/README.md``, "The ``prose`` corpus").

    Descriptions and documentation files must read as prose (:func:`is_prose`: no tables of numbers, word lists
    or command output). Every document holds at least :data:`MIN_PROSE_CHARS` characters. A document whose text,
    its whitespace collapsed, equals an earlier one's is skipped (a README shipped both as a package's
    ``README.md`` and as its description, a vendored copy), and the split is drawn from that same collapsed text,
    so copies that differ in whitespace alone never straddle train and val. The order is deterministic
    (:func:`source_files`), and so are the documents with any number of ``workers``: the processes that read the
    files of every part (default: every CPU this process may use, at most one per :data:`_FILES_PER_WORKER` files,
    as a spawned process takes seconds to start).

    Raises:
        ValueError: ``val_fraction`` out of range, ``workers`` below 1, a root that is not a directory, or no
            ``*.py`` file.
    """
    _check_val_fraction(val_fraction)
    parts = _prose_parts(roots)
    return _prose_stream(parts, val_fraction, _parse_workers(workers, sum(len(files) for files, _ in parts)))


def _prose_stream(parts: list[tuple[list[Path], Callable[[str], str]]], val_fraction: float,
                  workers: int) -> Iterator[tuple[str, str]]:
    """:func:`prose_documents`' documents from ``parts``, with ``workers`` processes reading every part's files.

    Every part's files are queued at once and the documents come out as they are read, so the consumer (the
    tokenizer) works while the workers parse and no worker idles between parts; a consumer that stops early
    cancels what is still queued."""
    seen: set[bytes] = set()  # one set: a document repeated in two parts is taken once
    # spawned, not forked: the caller may hold threads (a tokenizer's) that a fork would copy mid-flight; with one
    # worker, the built-in lazy map reads one file at a time, so a whole environment's sources need not be in memory
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) if workers > 1 else None
    read = map if pool is None else functools.partial(pool.map, chunksize=64)
    try:
        streams = [read(_file_text, files, itertools.repeat(text_of)) for files, text_of in parts]
        for texts in streams:
            yield from _documents_of(texts, val_fraction, seen, _collapsed_digest)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _collapsed_digest(text: str) -> bytes:
    """SHA-256 of ``text`` with every run of whitespace made one space and none at the ends."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).digest()


def _long_prose(text: str) -> str:
    """``text`` stripped when it is prose (:func:`is_prose`) of at least :data:`MIN_PROSE_CHARS` characters, else
    ``""``."""
    text = text.strip()
    return text if len(text) >= MIN_PROSE_CHARS and is_prose(text) else ""


def _description_prose(text: str) -> str:
    return _long_prose(package_description(text))


def _at_least(extract: Callable[[str], str], minimum: int, text: str) -> str:
    """``extract(text)``, or ``""`` when it is shorter than ``minimum`` characters."""
    prose = extract(text)
    return prose if len(prose) >= minimum else ""


# Each file's document of a part, as module-level callables that worker processes can unpickle: a Python file's
# prose and a C/C++ file's comments, each at least MIN_PROSE_CHARS.
_python_file_prose = functools.partial(_at_least, python_prose, MIN_PROSE_CHARS)
_c_file_prose = functools.partial(_at_least, c_comments, MIN_PROSE_CHARS)


def _file_text(path: Path, text_of: Callable[[str], str]) -> str | None:
    """``text_of`` the file's text, or ``None`` for a file that is unreadable or not UTF-8."""
    try:
        return text_of(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def _file_documents(files: list[Path], val_fraction: float,
                    text_of: Callable[[str], str]) -> Iterator[tuple[str, str]]:
    """``(split, text_of(file's text))`` for each readable UTF-8 file whose document is not empty and not a repeat
    of an earlier one (packages vendor identical copies: a repeat would be seen twice, and could never straddle the
    split anyway), in file order, one file at a time; its split is drawn from the SHA-256 of its text
    (:func:`_split_of`)."""
    return _documents_of((_file_text(path, text_of) for path in files), val_fraction, set(), None)


def _documents_of(texts: Iterable[str | None], val_fraction: float, seen: set[bytes],
                  digest_of: Callable[[str], bytes] | None) -> Iterator[tuple[str, str]]:
    """``(split, text)`` for each of ``texts`` that is not ``None`` (an unreadable file), not blank and not a
    repeat: a text repeats another when their ``digest_of`` (``None``: SHA-256 of the text) are equal, among the
    digests in ``seen`` (shared by several calls to deduplicate across them; this adds to it)."""
    for text in texts:
        if text is None:
            continue
        digest = hashlib.sha256(text.encode("utf-8")).digest() if digest_of is None else digest_of(text)
        if not text.strip() or digest in seen:
            continue
        seen.add(digest)
        yield _split_of(digest, val_fraction), text
