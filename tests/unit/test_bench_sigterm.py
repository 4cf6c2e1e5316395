"""bench/common.py: a benchmark told to stop with SIGTERM leaves through its `with` blocks.

Python's default for SIGTERM ends the process at once, past every `finally`: a benchmark
stopped that way left its whole LocalCluster running (etcd, controller, brokers, gateway).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_runs_the_finally_blocks_and_exits_143(tmp_path: Path) -> None:
    cleaned = tmp_path / "cleaned"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from bench import common
        with common.stopped_by_sigterm():
            try:
                # Python runs the handler before the next line; without one, the process ends here.
                os.kill(os.getpid(), signal.SIGTERM)
                print("SIGTERM did not stop this process")
            finally:
                open({str(cleaned)!r}, "w").write("stopped")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True, text=True)
    assert done.returncode == 143, done.stderr
    assert cleaned.read_text() == "stopped"


def test_the_handler_before_is_put_back() -> None:
    script = textwrap.dedent(
        f"""
        import signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from bench import common
        with common.stopped_by_sigterm():
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
