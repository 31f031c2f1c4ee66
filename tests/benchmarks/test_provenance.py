"""``provenance.git_revision``: the short commit, ``+dirty`` only for changes under the watched paths (relative to
the repository root, wherever the caller runs) outside the records, and ``$GIT_REV`` first."""

from __future__ import annotations

import subprocess

import provenance


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def test_dirty_only_under_the_watched_paths_and_git_rev_wins(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "composer_qsdp").mkdir(parents=True)
    (repo / "yamls").mkdir()
    (repo / "composer_qsdp" / "code.py").write_text("x = 1\n")
    (repo / "yamls" / "r.yaml").write_text("a: 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = _git(repo, "rev-parse", "--short", "HEAD")
    monkeypatch.setattr(provenance, "ROOT", repo)
    monkeypatch.delenv("GIT_REV", raising=False)
    monkeypatch.chdir(tmp_path)  # not the repository: the pathspecs must still be the root's

    assert provenance.git_revision() == head
    record = repo / "benchmarks" / "results" / "2026-01-01_cpu_x"
    record.mkdir(parents=True)
    (record / "table.md").write_text("| a |\n")
    assert provenance.git_revision() == head  # a record being written is output, not the code it measured
    (repo / "benchmarks" / "bench.py").write_text("y = 1\n")
    assert provenance.git_revision() == head + "+dirty"  # an untracked benchmark is code
    (repo / "benchmarks" / "bench.py").unlink()
    (repo / "yamls" / "r.yaml").write_text("a: 2\n")
    assert provenance.git_revision() == head  # not watched by default
    assert provenance.git_revision(("composer_qsdp", "yamls")) == head + "+dirty"
    (repo / "composer_qsdp" / "code.py").write_text("x = 2\n")
    assert provenance.git_revision() == head + "+dirty"
    monkeypatch.setenv("GIT_REV", "abc1234")
    assert provenance.git_revision() == "abc1234"


def test_unknown_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    monkeypatch.delenv("GIT_REV", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert provenance.git_revision() == "unknown (set GIT_REV)"
