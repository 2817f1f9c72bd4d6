"""The README's first screen shows a model file: it must be one autotune runs."""

from __future__ import annotations

import re

import pytest

from .conftest import FAST, ROOT, run_cli


def readme_model_file() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "the README shows no model file"
    return blocks[0]


def test_the_readmes_model_file_is_short() -> None:
    lines = [line for line in readme_model_file().splitlines() if line.strip()]
    assert len(lines) <= 14, len(lines)


@pytest.mark.slow
def test_the_readmes_model_file_trains_under_autotune(tmp_path) -> None:
    model = tmp_path / "model.py"
    model.write_text(readme_model_file())
    done = run_cli("bench", "--model", str(model), "--device", "cpu", *FAST, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "samples/sec" in done.stdout
