"""The ``pysource`` text source (Python files of installed packages): deterministic file order, one listing per
file, skipped documents (empty, not UTF-8, duplicates), the hash split, and the build CLI end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from streaming import StreamingDataset

from composer_qsdp.recipes.data import (
    EOT_TOKEN_ID,
    assign_split,
    default_python_source_roots,
    gpt2_tokenizer,
    python_source_documents,
    python_source_files,
)
from composer_qsdp.recipes.data.build import main as build_main


def make_tree(root) -> dict[str, str]:
    """A package tree: nested files, a duplicate, an empty file, a latin-1 file and a non-Python file."""
    files = {
        "b_pkg/__init__.py": "",
        "b_pkg/core.py": "def core(x):\n    return x * 2\n",
        "a_pkg/util.py": "import os\n\nVALUE = os.sep\n",
        "a_pkg/sub/deep.py": "class Deep:\n    '''A docstring.'''\n    pass\n",
        "a_pkg/vendored/core.py": "def core(x):\n    return x * 2\n",  # same text as b_pkg/core.py
        "a_pkg/notes.txt": "not python",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "c_latin1.py").write_bytes("# -*- coding: latin-1 -*-\nNAME = 'caf\xe9'\n".encode("latin-1"))
    return files


def test_files_are_sorted_and_listed_once(tmp_path):
    make_tree(tmp_path / "site")
    (tmp_path / "site" / "z_link.py").symlink_to(tmp_path / "site" / "a_pkg" / "util.py")
    files = python_source_files([tmp_path / "site", tmp_path / "site" / "a_pkg"])  # overlapping roots
    rel = [str(p.relative_to(tmp_path / "site")) for p in files]
    assert rel == ["a_pkg/sub/deep.py", "a_pkg/util.py", "a_pkg/vendored/core.py", "b_pkg/__init__.py",
                   "b_pkg/core.py", "c_latin1.py"]  # the link and the second root's copies are not repeated


def test_documents_skip_empty_non_utf8_and_duplicates(tmp_path):
    files = make_tree(tmp_path)
    documents = list(python_source_documents(0.5, [tmp_path]))
    texts = [text for _, text in documents]
    assert texts == [files["a_pkg/sub/deep.py"], files["a_pkg/util.py"], files["a_pkg/vendored/core.py"]]
    assert [split for split, _ in documents] == [assign_split(t, 0.5) for t in texts]


def test_default_roots_are_the_existing_site_packages_and_the_stdlib(tmp_path, monkeypatch):
    make_tree(tmp_path / "site")
    make_tree(tmp_path / "stdlib")
    monkeypatch.setattr("composer_qsdp.recipes.data.sources.site.getsitepackages",
                        lambda: [str(tmp_path / "site"), str(tmp_path / "never-created")])
    monkeypatch.setattr("composer_qsdp.recipes.data.sources.sysconfig.get_paths", lambda: {"stdlib": str(tmp_path / "stdlib")})
    assert default_python_source_roots() == [str(tmp_path / "site"), str(tmp_path / "stdlib")]
    assert python_source_files() == python_source_files([tmp_path / "site", tmp_path / "stdlib"])


def test_default_roots_hold_this_interpreter_s_packages_and_stdlib():
    import json

    import omegaconf

    roots = [Path(r).resolve() for r in default_python_source_roots()]
    for module in (json, omegaconf):  # a standard-library module and an installed distribution
        assert any(Path(module.__file__).resolve().is_relative_to(root) for root in roots), module.__name__


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="do not exist or are not directories"):
        python_source_files([tmp_path / "missing"])
    (tmp_path / "only.txt").write_text("x")
    with pytest.raises(ValueError, match="no \\*.py files"):
        python_source_files([tmp_path])
    with pytest.raises(ValueError, match="val_fraction=2"):
        next(python_source_documents(2, [tmp_path]))


def test_build_cli_pysource(tmp_path, capsys):
    make_tree(tmp_path / "site")
    for i in range(30):  # enough documents for both splits
        (tmp_path / "site" / "gen" / f"mod{i:02d}.py").parent.mkdir(exist_ok=True)
        (tmp_path / "site" / "gen" / f"mod{i:02d}.py").write_text(f"def f{i}(a, b):\n    return a + {i} * b\n")
    out = tmp_path / "shards"
    assert build_main(["pysource", str(out), "--input", str(tmp_path / "site"), "--seq-len", "4",
                       "--val-fraction", "0.3"]) == 0
    assert "wrote" in capsys.readouterr().out
    # Reference: the kept documents in file order, split by their hash, each + <|endoftext|>, cut into samples.
    tokenizer = gpt2_tokenizer()
    texts = [text for _, text in python_source_documents(0.3, [tmp_path / "site"])]
    assert len(texts) == 33
    for split in ("train", "val"):
        stream = [t for text in texts if assign_split(text, 0.3) == split
                  for t in tokenizer.encode_ordinary(text) + [EOT_TOKEN_ID]]
        expected = np.array(stream[: len(stream) // 4 * 4]).reshape(-1, 4)
        dataset = StreamingDataset(local=str(out), split=split, shuffle=False)
        got = np.stack([dataset[i]["tokens"] for i in range(dataset.num_samples)]).astype(np.int64)
        assert len(expected) > 0
        np.testing.assert_array_equal(got, expected)
