"""Each preset's loss label in its docstring (``composer_qsdp.config.presets``) is the one the presets page gives
(``docs/presets.md``'s table), and every registered preset has one in both: a label changed on one side only would
tell users two things about the same preset."""

from __future__ import annotations

import re
from pathlib import Path

from composer_qsdp.config import QSDPConfig, presets

ROOT = Path(__file__).resolve().parents[2]
LABELS = ("lossless", "lossy", "unproven")
# "* ``name``: ... Loss: label" up to the next bullet or the end of the list
DOC_BULLET = re.compile(r"^\* ``([\w.-]+)``:(.*?)(?=^\* ``|^\S)", re.MULTILINE | re.DOTALL)
DOC_LABEL = re.compile(r"Loss: (\w+)")
# "| `name` (the default) | bytes | **label: ...** | evidence |"
PAGE_ROW = re.compile(r"^\| `([\w.-]+)`[^|]* \| [^|]* \| (?:\*\*)?(\w+)", re.MULTILINE)


def docstring_labels() -> dict[str, str]:
    """Each bulleted preset's label in the module docstring (the word after ``Loss:``)."""
    labels = {}
    for name, text in DOC_BULLET.findall(presets.__doc__ or ""):
        found = DOC_LABEL.findall(text)
        assert len(found) == 1, f"preset {name!r}: its docstring bullet gives {len(found)} 'Loss:' labels, not one"
        labels[name] = found[0]
    return labels


def page_labels() -> dict[str, str]:
    """Each preset's label in the table of docs/presets.md that has a label column."""
    text = (ROOT / "docs" / "presets.md").read_text()
    table = text[text.index("| preset | fewer bytes than plain FSDP2"):]
    table = table[:table.index("\n\n")]
    return dict(PAGE_ROW.findall(table))


def test_every_preset_has_one_known_label_in_its_docstring_and_on_the_page() -> None:
    names = set(QSDPConfig.preset_names())
    for where, labels in (("docstring", docstring_labels()), ("docs/presets.md", page_labels())):
        assert set(labels) == names, f"{where}: presets without a label {sorted(names - set(labels))}, " \
                                     f"labels of no preset {sorted(set(labels) - names)}"
        assert set(labels.values()) <= set(LABELS), f"{where}: labels {labels}; allowed {LABELS}"


def test_the_docstring_and_the_page_give_each_preset_the_same_label() -> None:
    assert docstring_labels() == page_labels()
