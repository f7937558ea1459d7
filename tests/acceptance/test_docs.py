"""The documentation builds without a warning, and its examples run as written: every code block whose
first line names a file (`# myflows.py`) is written to that file, and the tests among them run with pytest
against a database of this test's server, as a reader would run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: A fenced python block whose first line is a comment naming a file.
_NAMED_BLOCK = re.compile(r"```python\n# ([a-z_]+\.py)\n(.*?)```", re.DOTALL)


def named_blocks() -> dict[str, str]:
    found: dict[str, str] = {}
    for page in sorted(DOCS.glob("*.md")):
        for name, body in _NAMED_BLOCK.findall(page.read_text(encoding="utf-8")):
            assert name not in found, f"{page.name}: a second block names {name}"
            found[name] = f"# {name}\n{body}"
    return found


def test_the_docs_build_without_a_warning(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "node-context" / "index.html").exists()


def test_the_docs_examples_run_as_written(tmp_path: Path, admin_url: str) -> None:
    blocks = named_blocks()
    assert {
        "myflows.py",
        "read_models.py",
        "conftest.py",
        "test_myflows.py",
        "test_read_models.py",
        "test_retention.py",
    } <= set(blocks)
    for name, text in blocks.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TEST_DATABASE_ADMIN_URL": admin_url}
    env.pop("LEDGERFLOW_DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "3 passed" in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_page_is_in_the_navigation(page: str) -> None:
    assert f": {page}" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
