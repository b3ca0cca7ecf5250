"""docs/config.md is the generated key reference of the config classes, and is current."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.cli.config_docs import MARKER, main, page

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "config.md"


def test_committed_page_equals_the_generated_one() -> None:
    committed = PAGE.read_text()
    assert page(committed) == committed, "docs/config.md is stale: run `tidal config-docs`"


def test_every_key_has_a_row_with_type_and_default() -> None:
    text = PAGE.read_text()
    assert "| `trainer.optim.lr` | `float` | `0.001` |" in text
    assert '| `orchestrator.task.num_numbers` | `int` | `3` | (type = "countdown")' in text
    assert "## sft" in text and "## export" in text


def test_the_intro_above_the_marker_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "config.md").write_text(f"# Hand-written\n\n{MARKER}\nold rows\n")
    monkeypatch.chdir(tmp_path)
    main(["--out", "out.md"])
    written = (tmp_path / "out.md").read_text()
    assert written.startswith(f"# Hand-written\n\n{MARKER}\n\n## run")
    assert "old rows" not in written
