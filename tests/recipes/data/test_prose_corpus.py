"""The ``prose`` corpus of the convergence protocol (:func:`prose_documents`): what it takes from a site-packages tree
(distribution descriptions, documentation files, the docstrings and prose comments of ``*.py`` files) and what it
skips (license texts, packaging records, test fixtures, data, short texts, commented-out code), its order, its
deduplication across parts and copies that differ in whitespace (never on both sides of the split), and the build
CLI's ``--min-train-tokens``."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest

from composer_qsdp.recipes.data.build import main as build_main
from composer_qsdp.recipes.data.sources import (
    VAL_SPLIT,
    c_comments,
    documentation_files,
    is_prose,
    package_description,
    package_metadata_files,
    prose_documents,
    prose_source_files,
    python_comments,
    python_docstrings,
    python_prose,
)

README = """# pkg_a

pkg_a is a small library that computes the things you need. It is written for people who want to do this
with as little code as possible, and it works with any version of the interpreter that is still supported.

Install it with pip, then call `pkg_a.compute` on the data that you have.
"""

GUIDE = """Guide
=====

This guide shows how the scheduler of pkg_a works. It is the part of the package that decides when a task
runs, which worker it is given to and what happens when that worker fails before the task is finished.
"""

OLD_STYLE_README = """pkg_b: the other package. It is meant to be used with pkg_a, and it is older than it:
the description of this distribution is in a header of its metadata, as the tools of its time wrote it,
and each of its lines after the first is indented by eight spaces in the file."""

LICENSE = """Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction, including without
limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of it.
"""

MODULE = '''# Copyright (c) 2026 The pkg_a authors. Licensed under the MIT license.
# -*- coding: utf-8 -*-
"""The core of pkg_a: the scheduler that decides when a task runs and on which worker."""

import os

# The queue holds the tasks that wait for a worker, in the order in which
# they were submitted; a task leaves it when a worker takes it.
QUEUE = []  # noqa: F401  (an inline comment: not taken)

# result = compute(QUEUE)
# print(result)


def run(task):
    """Run ``task`` on the first free worker and return what it returned."""
    # type: ignore
    query = """
    # SELECT id FROM tasks WHERE id = 1
    """
    if task not in QUEUE:
        raise ValueError(f"task {task!r} is not in the queue of this scheduler")
    return os.fspath(task), query, "task_id"
'''

HEADER = """/* Copyright (c) 2026 The pkg_a authors. Licensed under the MIT license. */
#include <stddef.h>

/**
 * Schedule a task on the first free worker of the pool, and return the index
 * of that worker, or -1 when every worker of the pool is busy.
 */
int pkg_a_schedule(const char *task);  // never blocks: the caller retries

// The pool holds the workers that the scheduler may give a task to, in the
// order in which they were started.
static const char *pool_name = "// not a comment: a string";
// int unused = 0;
// pool_name = NULL;
"""


def metadata(body: str, name: str) -> str:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nSummary: a package\n\n{body}"


def make_site(root: Path) -> dict[str, str]:
    """A site-packages tree with one file of each kind :func:`prose_documents` takes or skips."""
    numbers = "\n".join(" ".join(f"{(i * j) % 97 / 7:.4f}" for j in range(8)) for i in range(60))
    files = {
        "pkg_a-1.0.dist-info/METADATA": metadata(README, "pkg_a"),
        "pkg_a-1.0.dist-info/RECORD": "pkg_a/__init__.py,sha256=abc,10\npkg_a/core.py,sha256=def,20\n",
        "pkg_a-1.0.dist-info/entry_points.txt": "[console_scripts]\npkg-a = pkg_a:main\n",
        "pkg_a-1.0.dist-info/licenses/LICENSE.md": LICENSE,
        "pkg_b-2.0.dist-info/METADATA": ("Metadata-Version: 1.1\nName: pkg_b\nVersion: 2.0\nDescription: "
                                         + OLD_STYLE_README.replace("\n", "\n        ") + "\nPlatform: any\n"),
        "pkg_c-0.1.dist-info/METADATA": "Metadata-Version: 1.0\nName: pkg_c\nVersion: 0.1\nDescription: UNKNOWN\n",
        "pkg_a/README.md": README.replace("\n\n", "\n\n\n").replace(". ", ".  "),  # the description, respaced
        "pkg_a/docs/guide.rst": GUIDE,
        "pkg_a/LICENSE.txt": LICENSE,
        "pkg_a/COPYING.md": LICENSE + "\nAnother copy.\n",
        "pkg_a/ThirdPartyNotices.txt": LICENSE + "\nA third copy.\n",
        "pkg_a/data/numbers.txt": numbers,
        "pkg_a/requirements.txt": "numpy>=1.0\ntorch>=2.0\nthis-is-a-requirement-list-of-the-package==1.0\n" * 9,
        "pkg_a/tests/fixture.txt": GUIDE.replace("Guide", "Fixture"),
        "pkg_a/notes.txt": "Too short to be prose, though it is English.",
        "pkg_a/core.py": MODULE,
        "pkg_a/include/core.h": HEADER,
        "pkg_a/short.py": '"""A short docstring."""\n# and a comment of no length\n',
        "pkg_b/vendored/guide.md": GUIDE + "\n",  # pkg_a's guide again, in another package
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return files


def collapsed_digest(text: str) -> bytes:
    return hashlib.sha256(" ".join(text.split()).encode()).digest()


def test_prose_documents_take_descriptions_docs_and_python_prose_and_skip_the_rest(tmp_path):
    make_site(tmp_path)
    texts = [text for _, text in prose_documents(0.5, [tmp_path])]
    assert texts == [
        README.strip(),  # pkg_a's description; its README.md repeats it with other spacing: skipped
        OLD_STYLE_README,  # pkg_b's Description header, unindented; pkg_c's UNKNOWN: nothing
        GUIDE.strip(),  # docs/guide.rst; pkg_b's vendored copy is skipped
        python_prose(MODULE),
        c_comments(HEADER),
    ]
    prose = texts[-2]
    assert prose == (
        "The core of pkg_a: the scheduler that decides when a task runs and on which worker.\n\n"
        "The queue holds the tasks that wait for a worker, in the order in which\n"
        "they were submitted; a task leaves it when a worker takes it.\n\n"
        "Run ``task`` on the first free worker and return what it returned.\n\n"
        "task {} is not in the queue of this scheduler")  # a message, its replacement field as {}
    for skipped in ("Copyright", "coding", "noqa", "compute(QUEUE)", "type: ignore", "SELECT", "task_id"):
        assert skipped not in prose
    assert texts[-1] == (
        "Schedule a task on the first free worker of the pool, and return the index\n"
        "of that worker, or -1 when every worker of the pool is busy.\n\n"
        "never blocks: the caller retries\n\n"
        "The pool holds the workers that the scheduler may give a task to, in the\n"
        "order in which they were started.")
    joined = "\n".join(texts)
    for skipped in ("Permission is hereby granted", "Fixture", "console_scripts", "sha256", "numpy>=", "0.0000",
                    "Too short"):
        assert skipped not in joined


def test_file_listings_skip_licenses_records_tests_and_requirements(tmp_path):
    make_site(tmp_path)
    rel = [str(p.relative_to(tmp_path)) for p in documentation_files([tmp_path])]
    assert rel == ["pkg_a/README.md", "pkg_a/data/numbers.txt", "pkg_a/docs/guide.rst", "pkg_a/notes.txt",
                   "pkg_b/vendored/guide.md"]  # numbers and notes are left out later: not prose, too short
    rel = [str(p.relative_to(tmp_path)) for p in package_metadata_files([tmp_path])]
    assert rel == ["pkg_a-1.0.dist-info/METADATA", "pkg_b-2.0.dist-info/METADATA", "pkg_c-0.1.dist-info/METADATA"]
    rel = [str(p.relative_to(tmp_path)) for p in prose_source_files([tmp_path])]
    assert rel[:3] == ["pkg_a-1.0.dist-info/METADATA", "pkg_b-2.0.dist-info/METADATA", "pkg_c-0.1.dist-info/METADATA"]
    assert rel[-3:] == ["pkg_a/core.py", "pkg_a/short.py", "pkg_a/include/core.h"]  # Python, then C
    (tmp_path / "misplaced").mkdir()
    (tmp_path / "misplaced" / "METADATA").write_text(metadata(GUIDE, "nothing"))  # not in a *.dist-info folder
    assert len(package_metadata_files([tmp_path])) == 3


def test_package_description_body_header_and_none():
    assert package_description(metadata(README, "pkg_a")) == README.strip()
    header = "Metadata-Version: 1.2\nName: x\nDescription: First line.\n       |Second line.\n        Third.\n"
    assert package_description(header) == "First line.\nSecond line.\nThird."
    assert package_description("Metadata-Version: 1.0\nName: x\nDescription: UNKNOWN\n") == ""
    assert package_description("Metadata-Version: 2.1\nName: x\n") == ""


def test_is_prose_tells_sentences_from_data():
    assert is_prose(README) and is_prose(GUIDE)
    assert not is_prose("0.1 0.2 0.3\n" * 50)
    assert not is_prose("Athens Greece Baghdad Iraq\n" * 50)  # a word list
    assert not is_prose("numpy>=1.0\ntorch>=2.0\n")
    assert not is_prose("")


def test_python_comments_are_prose_blocks_only():
    assert python_comments(MODULE).split("\n\n") == [
        "The queue holds the tasks that wait for a worker, in the order in which\n"
        "they were submitted; a task leaves it when a worker takes it."]
    source = "def f(x):\n    # Return twice the input,\n    #   indented on purpose.\n    return 2 * x  # no\n"
    assert python_comments(source) == "Return twice the input,\n  indented on purpose."
    assert python_comments("# [B, T, C]\n# x = f(y)\nx = 1\n") == ""  # code, not prose
    assert python_comments("def broken(:\n# a comment of a file that does not parse\n") == ""
    assert "inside" not in python_comments('x = """\n# a line inside a string, not a comment\n"""\n')


def test_lone_surrogates_in_literals_become_question_marks():
    """``"\\udc80"`` in a literal is a lone surrogate once parsed, which UTF-8 (the split hash, the tokenizer)
    cannot encode: the prose keeps the text around it."""
    source = ('"""A module whose docstring holds a lone surrogate: \\udc80, and more words."""\n'
              'raise ValueError("the byte \\udc80 cannot be decoded as a character of this file")\n')
    prose = python_prose(source)
    assert prose == ("A module whose docstring holds a lone surrogate: ?, and more words.\n\n"
                     "the byte ? cannot be decoded as a character of this file")
    assert python_docstrings(source).encode("utf-8")


def test_c_comments_are_prose_comments_only():
    assert c_comments("/* Copyright 2026 NVIDIA. All rights reserved. */\nint x;\n") == ""  # a legal header
    assert c_comments('const char *s = "/* a string, not a comment */";\n') == ""
    assert c_comments("// x = y + 1;\n// return x;\n") == ""  # commented-out code
    assert c_comments("/*! \\brief Add two numbers.\n * \\return their sum. */\n") == \
        "\\brief Add two numbers.\n\\return their sum."


def test_prose_documents_are_deterministic_and_the_same_from_worker_processes(tmp_path):
    make_site(tmp_path)
    for i in range(30):  # python files with prose, some repeating another's with other spacing
        body = MODULE.replace("the scheduler", f"the scheduler number {i % 20}")
        (tmp_path / "pkg_a" / f"m{i:02d}.py").write_text(body if i < 20 else body.replace("a task", "a  task"))
    latin1 = MODULE.replace("the scheduler", "the latin-1 scheduler").encode() + b"# caf\xe9\n"
    (tmp_path / "pkg_a" / "z_latin1.py").write_bytes(latin1)  # new prose, but not UTF-8: skipped by workers too
    serial = list(prose_documents(0.5, [tmp_path], workers=1))
    assert serial == list(prose_documents(0.5, [tmp_path], workers=1))
    assert list(prose_documents(0.5, [tmp_path], workers=2)) == serial
    stream = prose_documents(0.5, [tmp_path], workers=2)  # a build that reaches its token cap stops reading early
    assert list(itertools.islice(stream, 3)) == serial[:3]
    stream.close()  # cancels the files still queued, and returns
    assert len(serial) == 2 + 1 + 1 + 20 + 1  # descriptions, the guide, core.py, m00..m19 (not m20..m29: the
    # same with other spacing; not z_latin1.py) and core.h
    with pytest.raises(ValueError, match="workers=0"):
        prose_documents(0.5, [tmp_path], workers=0)
    with pytest.raises(ValueError, match="val_fraction"):
        prose_documents(1.0, [tmp_path])


def test_copies_never_straddle_train_and_val(tmp_path):
    """Many packages ship the same README and guide, some with other whitespace: each text is one document, whose
    split is drawn from its whitespace-collapsed text, so no copy can land on the other side."""
    for i in range(40):
        pkg = tmp_path / f"pkg{i:02d}"
        (pkg / "docs").mkdir(parents=True)
        guide = GUIDE.replace("pkg_a", f"package number {i % 20}")  # packages i and i + 20: other spacing
        (pkg / "docs" / "guide.rst").write_text(guide if i < 20 else guide.replace("\n", "\n\n"))
        (pkg / "docs" / "shared.md").write_text(README.replace("  ", " ") if i % 3 else README + "\n   \n")
        (pkg / "core.py").write_text(MODULE)
    documents = list(prose_documents(0.5, [tmp_path]))
    digests = [collapsed_digest(text) for _, text in documents]
    assert len(digests) == len(set(digests)) == 20 + 1 + 1  # the 20 distinct guides, the README, the module
    splits = {split for split, _ in documents}
    assert splits == {"train", "val"}  # both sides are used, yet every text is on one only
    for split, text in documents:
        assert split == (VAL_SPLIT if int.from_bytes(collapsed_digest(text)[:8], "big") / 2**64 < 0.5 else "train")


def test_build_cli_prose_and_min_train_tokens(tmp_path, capsys):
    src = tmp_path / "src"
    make_site(src)
    for i in range(40):
        (src / "pkg_a" / f"m{i}.py").write_text(MODULE.replace("the scheduler", f"scheduler {i}"))
    out = tmp_path / "shards"
    assert build_main(["prose", str(out), "--seq-len", "16", "--input", str(src), "--val-fraction", "0.2"]) == 0
    train = sum(s["samples"] for s in json.loads((out / "train" / "index.json").read_text())["shards"])
    assert train > 0 and (out / "val" / "index.json").is_file()
    capsys.readouterr()

    # A run that needs more train tokens than the text gives: the build fails, naming both counts.
    short = tmp_path / "short"
    code = build_main(["prose", str(short), "--seq-len", "16", "--input", str(src), "--val-fraction", "0.2",
                       "--min-train-tokens", str(train * 16 + 1)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"the train split holds {train * 16} tokens, fewer than --min-train-tokens {train * 16 + 1}" in err
    enough = tmp_path / "enough"
    assert build_main(["prose", str(enough), "--seq-len", "16", "--input", str(src), "--val-fraction", "0.2",
                       "--min-train-tokens", str(train * 16), "--max-train-tokens", str(10**6)]) == 0
    assert "the text ran out at" in capsys.readouterr().out  # the cap was not reached: said, not an error
