"""bench/producer_state_rebuild.py runs and finds every producer both ways (its figures are not checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import producer_state_rebuild


def test_the_script_times_both_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        producer_state_rebuild.main(
            ["--size-mib", "1", "--repeat", "1", "--producers", "3", "--dir", str(tmp_path)]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "start with the snapshot" in out and "start from the log alone" in out and "ratio:" in out
    assert list(tmp_path.iterdir()) == []  # its temporary directory is gone
