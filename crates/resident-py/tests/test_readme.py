"""The README's and the guide's Python examples, verbatim (extracted from the files)."""

import pathlib
import re
import runpy

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
def test_example_runs(code, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")
