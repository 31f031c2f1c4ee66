"""The other offline corpora of the convergence protocol: ``csource`` (C/C++/CUDA files of installed packages) and
the docstrings of Python files (part of the ``prose`` corpus: ``test_prose_corpus.py``), and the build CLI for
``csource`` and ``prose``."""

from __future__ import annotations

import fnmatch
import inspect
import json

import pytest

from composer_qsdp.recipes.data import c_source_documents, source_files
from composer_qsdp.recipes.data.build import main as build_main
from composer_qsdp.recipes.data.sources import C_SOURCE_PATTERNS, python_docstrings

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


def rglob_reference(patterns, roots):
    """source_files' listing as Path.rglob("*") and fnmatchcase give it: sorted per root, a file once."""
    files, seen = [], set()
    for root in sorted(roots):
        for path in sorted(p for p in root.rglob("*") if any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns)):
            real = path.resolve()
            if real not in seen and real.is_file():
                seen.add(real)
                files.append(path)
    return files


def test_source_files_list_what_rglob_and_fnmatch_list(tmp_path):
    tree = tmp_path / "tree"
    for rel in ("inc/a.h", "inc/deep/er/b.hpp", ".hidden/c.c", "src/.d.cc", "src/E.H", "src/f.h.txt", "d.c/g.c",
                "x/h.py", "x/i.pyc", "x/j.cu", "x/k[1].cuh", "y/a.h", "../outside/o.h"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(f"// {rel}\n")
    (tree / "w").symlink_to(tmp_path / "outside", target_is_directory=True)  # a link to a folder: not followed
    (tree / "v.h").symlink_to(tree / "inc", target_is_directory=True)  # a folder's name that matches: no file
    (tree / "z_link.h").symlink_to(tree / "inc" / "a.h")  # a second name of a listed file
    (tree / "dangling.c").symlink_to(tree / "missing.c")
    roots = [tree / "x", tree]  # overlapping roots
    for patterns in (C_SOURCE_PATTERNS, ("*.py",), ("[a-d].*", "k?1*")):
        assert source_files(patterns, roots) == rglob_reference(patterns, roots)
    assert [str(p.relative_to(tree)) for p in source_files(C_SOURCE_PATTERNS, [tree])] == [
        ".hidden/c.c", "d.c/g.c", "inc/a.h", "inc/deep/er/b.hpp", "src/.d.cc", "x/j.cu", "x/k[1].cuh", "y/a.h"]
