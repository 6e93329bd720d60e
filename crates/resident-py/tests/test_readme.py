"""The README's and the guide's Python examples, verbatim (extracted from the files)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
SOURCES = [ROOT / "README.md", ROOT / "docs" / "guide" / "python.md"]


def blocks():
    out = []
    for src in SOURCES:
        text = src.read_text()
        for i, m in enumerate(re.finditer(r"```python\n(.*?)```", text, re.S)):
            out.append(pytest.param(m.group(1), id=f"{src.name}-{i}"))
    return out


BLOCKS = blocks()


def test_there_are_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("code", BLOCKS)
def test_example_runs(code):
    exec(compile(code, "<example>", "exec"), {"__name__": "__example__"})
