"""The other offline corpora of the convergence protocol: ``csource`` (C/C++/CUDA files of installed packages) and
the docstrings of Python files (part of the ``prose`` corpus: ``test_prose_corpus.py``), and the build CLI for
``csource`` and ``prose``."""

from __future__ import annotations

import inspect
import json

import pytest

from composer_qsdp.recipes.data import (
    assign_split,
    c_source_documents,
    python_docstring_documents,
    source_files,
)
from composer_qsdp.recipes.data.build import main as build_main
from composer_qsdp.recipes.data.sources import MIN_DOCSTRING_CHARS, python_docstrings

LONG = ("Compute the thing. " * 20).strip()  # a docstring long enough to count as prose

MODULE = f'''"""Module summary.

{LONG}
"""


class Widget:
    """A widget: holds parts."""

    def run(self, x):
        """Run it.

        Args:
            x: the input.
        """
        text = """not a docstring: an assigned string"""
        return x


async def later():
    """Await nothing."""


def bare():
    return 1
'''


def test_docstrings_in_source_order_without_other_strings():
    doc = python_docstrings(MODULE)
    assert doc.split("\n\n") == [
        "Module summary.", LONG.strip(), "A widget: holds parts.", "Run it.", "Args:\n    x: the input.",
        "Await nothing.",
    ]
    assert "assigned string" not in doc
    assert python_docstrings("def broken(:\n") == ""  # does not parse: no document
    assert python_docstrings("x = 1\n") == ""


def test_docstring_documents_skip_short_duplicate_and_unparsable_files(tmp_path):
    (tmp_path / "a.py").write_text(MODULE)
    (tmp_path / "b_copy.py").write_text(MODULE + "\nX = 2\n")  # other code, same docstrings: one document
    (tmp_path / "c_short.py").write_text('"""Too short."""\n')
    (tmp_path / "d_broken.py").write_text(f'"""{LONG}"""\ndef broken(:\n')
    documents = list(python_docstring_documents(0.5, [tmp_path]))
    assert [text for _, text in documents] == [python_docstrings(MODULE)]
    assert len(documents[0][1]) >= MIN_DOCSTRING_CHARS
    assert documents[0][0] == assign_split(documents[0][1], 0.5)


def test_docstring_documents_are_the_same_from_worker_processes(tmp_path):
    for i in range(40):  # several chunks' worth of files, some skipped, some repeated
        body = MODULE.replace("Await nothing.", f"Await nothing {i % 30}.") if i % 7 else '"""Too short."""\n'
        (tmp_path / f"m{i:02d}.py").write_text(body)
    (tmp_path / "z_latin1.py").write_bytes(f'"""{LONG}'.encode() + b'\xe9"""\n')  # not UTF-8: skipped there too
    serial = list(python_docstring_documents(0.5, [tmp_path], workers=1))
    # 34 long files, 7 of them repeating an earlier one's docstrings (i and i + 30), in file order
    assert len(serial) == 27
    assert list(python_docstring_documents(0.5, [tmp_path], workers=2)) == serial
    with pytest.raises(ValueError, match="workers=0"):
        python_docstring_documents(0.5, [tmp_path], workers=0)


def test_c_sources_are_every_c_cpp_and_cuda_file_once(tmp_path):
    files = {"inc/a.h": "int a(void);\n", "src/b.cpp": "int b() { return 1; }\n", "k/c.cuh": "__device__ int c;\n",
             "k/d.cu": "__global__ void d() {}\n", "x/e.py": "E = 1\n", "x/f.hpp": "int a(void);\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    texts = [text for _, text in c_source_documents(0.5, [tmp_path])]
    # sorted paths; f.hpp repeats a.h's text and the Python file is not C
    assert texts == [files["inc/a.h"], files["k/c.cuh"], files["k/d.cu"], files["src/b.cpp"]]
    assert [p.name for p in source_files(("*.py",), [tmp_path])] == ["e.py"]
    (tmp_path / "py_only").mkdir()
    (tmp_path / "py_only" / "g.py").write_text("G = 1\n")
    with pytest.raises(ValueError, match=r"no \*\.c / .* files under"):
        c_source_documents(0.5, [tmp_path / "py_only"])


@pytest.mark.parametrize("source", ["csource", "prose"])
def test_build_cli_writes_both_splits(source, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        body = inspect.cleandoc(f'''"""Module {i}: {LONG * 2}"""

            def f{i}(x):
                """Return x plus {i}, the {i}-th function of this test corpus."""
                return x + {i}
            ''')
        (src / f"m{i}.py").write_text(body + "\n")
        (src / f"h{i}.h").write_text(f"/* header {i} */\nint f{i}(int x);\n" * 30)
    out = tmp_path / "shards"
    assert build_main([source, str(out), "--seq-len", "16", "--input", str(src), "--val-fraction", "0.2"]) == 0
    for split in ("train", "val"):
        index = json.loads((out / split / "index.json").read_text())
        assert sum(shard["samples"] for shard in index["shards"]) > 0
