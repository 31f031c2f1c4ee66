"""A preset's paired gap to plain FSDP2 pooled over the seed protocol's cells: what it costs on average, and how sure.

Each cell of the protocol (a corpus and a model size) gives an arm three seeds or more, each against plain FSDP2's
run of the same seed; one cell's paired interval is wide (GPT-125M ``pysource``: +-1%), and the cell's verdict
(inside plain FSDP2's seed range) cannot exclude a cost of about that size. The cells are independent runs, so their
mean gaps pool: this reads each cell's convergence records, takes the arm's comparison at the protocol's length
(``seed_groups`` of ``convergence.py``'s JSON: the final validation loss of each run) and prints, per arm, each cell's
paired gap and the mean over the cells with its 95% interval and p (:func:`seed_stats.pool_paired`: every cell
weighs the same). Only complete comparisons enter the pool (at least three seeds a side at the protocol's length);
the others are listed with their verdicts.

    python benchmarks/pooled_gaps.py --arms w8g8 w8g4 qwd-w3g3-loco \\
        --cell 125m-pysource A.json B.json --cell 350m-prose C.json \\
        --alias qwd-w3g3-loco-ahead=qwd-w3g3-loco --out-dir DIR

``--cell NAME RECORD [RECORD ...]``: a cell and its records, oldest first (a later record's comparison of an arm
replaces an earlier one's). ``--alias RECORDED=ARM``: an arm recorded under another name that trains the same
(``qwd-w3g3-loco-ahead`` sends updates ahead and computes what ``qwd-w3g3-loco`` does). Writes ``pooled_gaps.md``
and ``pooled_gaps.json`` to ``--out-dir`` when given.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import e2e_common as common
import seed_stats
from convergence_report import read_record

__all__ = ["cell_comparisons", "main", "pooled_table"]


def cell_comparisons(records: list[Path], arms: list[str], aliases: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each of ``arms`` -> its comparison in the last of ``records`` (oldest first) that holds one, under its own
    name or a recorded name that ``aliases`` maps to it; an arm no record compares is absent."""
    found: dict[str, dict[str, Any]] = {}
    for path in records:
        for recorded, group in read_record(path).get("seed_groups", {}).items():
            arm = aliases.get(recorded, recorded)
            if arm in arms and group.get("comparison"):
                found[arm] = {**group["comparison"], "record": str(path), "recorded_as": recorded,
                              "baseline": group["baseline"]}
    return found


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def pooled_table(cells: dict[str, dict[str, dict[str, Any]]], arms: list[str]) -> tuple[str, dict[str, Any]]:
    """The markdown table and the JSON record of ``arms`` over ``cells`` (cell -> :func:`cell_comparisons`)."""
    names = list(cells)
    lines = ["| arm | " + " | ".join(f"`{n}`" for n in names) + " | pooled mean | 95% | p | df | cells above 0 |",
             "|---|" + "---|" * len(names) + "---|---|---|---|---|"]
    record: dict[str, Any] = {}
    for arm in arms:
        pooled_cells, row, left_out = {}, [], {}
        for name in names:
            c = cells[name].get(arm)
            if c is None:
                row.append("not run")
                left_out[name] = "not run"
                continue
            gaps = seed_stats.paired_gaps(*({seed_stats.parse_run_label(k): v for k, v in c[side].items()}
                                            for side in ("arm_losses", "baseline_losses")))
            mean = sum(gaps.values()) / len(gaps) if gaps else None
            if c["verdict"].startswith("incomplete") or len(gaps) < seed_stats.MIN_SEEDS:
                row.append(f"{common.fmt(mean, '+.2f', '%')} ({_count(len(gaps), 'seed')}, not pooled: {c['verdict']})")
                left_out[name] = c["verdict"]
                continue
            pooled_cells[name] = gaps
            row.append(f"{common.fmt(mean, '+.2f', '%')} ({_count(len(gaps), 'seed')})")
        kept = ("record", "recorded_as", "baseline", "step", "verdict")
        entry: dict[str, Any] = {"left_out": left_out,
                                 "cells": {n: {k: cells[n][arm][k] for k in kept} for n in names if arm in cells[n]}}
        if pooled_cells:
            pool = seed_stats.pool_paired(pooled_cells)
            ci = "n/a" if pool.ci95_pct is None else f"{pool.ci95_pct[0]:+.2f} .. {pool.ci95_pct[1]:+.2f}%"
            row += [f"**{common.fmt(pool.mean_pct, '+.2f', '%')}** ({_count(len(pooled_cells), 'cell')})", ci,
                    common.fmt(pool.p_value, ".3f"), common.fmt(pool.df, ".1f"), str(len(pool.above_cells))]
            entry["pooled"] = {"mean_pct": pool.mean_pct, "se_pct": pool.se_pct, "df": pool.df,
                               "ci95_pct": pool.ci95_pct, "p_value": pool.p_value, "above_cells": pool.above_cells,
                               "gaps_pct": {n: {str(s): g for s, g in gaps.items()} for n, gaps in pool.cells.items()}}
        else:
            row += ["no complete cell", "", "", "", ""]
        lines.append(f"| `{arm}` | " + " | ".join(row) + " |")
        record[arm] = entry
    return "\n".join(lines), record


def _alias(text: str) -> tuple[str, str]:
    recorded, sep, arm = text.partition("=")
    if not sep or not recorded or not arm:
        raise argparse.ArgumentTypeError(f"alias {text!r} is invalid; write RECORDED=ARM, e.g. "
                                         "qwd-w3g3-loco-ahead=qwd-w3g3-loco")
    return recorded, arm


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cell", nargs="+", action="append", required=True, metavar=("NAME", "RECORD"),
                   help="a cell's name and its convergence records (JSON), oldest first; repeat per cell")
    p.add_argument("--arms", nargs="+", required=True, help="the arms, in the table's order")
    p.add_argument("--alias", nargs="*", type=_alias, default=[], help="RECORDED=ARM: a recorded name of an arm")
    p.add_argument("--out-dir", type=Path, help="write pooled_gaps.md and pooled_gaps.json here")
    args = p.parse_args(argv)
    bad = [c[0] for c in args.cell if len(c) < 2]
    if bad:
        p.error(f"--cell {bad[0]} names no record; write --cell NAME RECORD [RECORD ...]")
    names = [c[0] for c in args.cell]
    if len(set(names)) < len(names):
        p.error(f"a cell is named twice in {names}; give each cell once, with all its records")
    missing = [path for c in args.cell for path in c[1:] if not Path(path).is_file()]
    if missing:
        p.error(f"no record at {missing[0]}")
    aliases = dict(args.alias)
    cells = {c[0]: cell_comparisons([Path(x) for x in c[1:]], args.arms, aliases) for c in args.cell}
    table, record = pooled_table(cells, args.arms)
    text = ("Paired gap of each arm's final validation loss to plain FSDP2's runs of the same seeds, per cell and "
            "pooled over the complete cells (each cell weighing the same; `benchmarks/pooled_gaps.py`):\n\n"
            + table + "\n")
    print(text, end="")
    if args.out_dir:
        common.write_json(args.out_dir / "pooled_gaps.json", {"arms": record, "aliases": aliases,
                                                              "cells": {c[0]: c[1:] for c in args.cell}})
        (args.out_dir / "pooled_gaps.md").write_text(text)


if __name__ == "__main__":
    main()
