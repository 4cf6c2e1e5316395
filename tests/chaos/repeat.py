"""Run the chaos suite several times in a row and stop at the first failing run.

    python -m tests.chaos.repeat               # 10 runs of tests/chaos
    python -m tests.chaos.repeat --runs 3 -- -k bounce

Each run is a fresh pytest process (its own clusters, etcd and processes, all on
127.0.0.1); a run that fails keeps its whole output in --log-dir and the loop stops
there, so "10 of 10" means ten consecutive green runs. Flaky-looking failures are
defects too: read the saved log before rerunning.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# One chaos run takes a few minutes on 2 cores; a run past this is stuck, not slow.
RUN_TIMEOUT_S = 1_800


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10, help="consecutive runs wanted (default 10)")
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=Path("data/chaos-repeat"),
        help="where each run's pytest output is kept (default data/chaos-repeat)",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    total_started = time.monotonic()
    for run in range(1, args.runs + 1):
        log_path = args.log_dir / f"run-{run:02d}.log"
        started = time.monotonic()
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "tests/chaos",
            "-q",
            "-p",
            "no:cacheprovider",
            *args.pytest_args,
        ]
        print(f"run {run}/{args.runs}: {' '.join(cmd[2:])} ...", end="", flush=True)
        try:
            with log_path.open("wb") as out:
                code = subprocess.run(
                    cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S, check=False
                ).returncode
        except subprocess.TimeoutExpired:
            print(f" stuck past {RUN_TIMEOUT_S} s; output in {log_path}")
            return 1
        summary = _summary(log_path)
        print(f" {summary} in {time.monotonic() - started:.0f} s")
        if code != 0:
            print(f"run {run} failed (pytest exit {code}); its output is in {log_path}")
            return 1
    print(f"{args.runs} of {args.runs} runs passed in {(time.monotonic() - total_started) / 60:.1f} min")
    return 0


def _summary(log_path: Path) -> str:
    """pytest's closing line ("5 passed, 1 skipped in 200.1s"), without the time."""
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    last = lines[-1].strip("= ") if lines else "no output"
    return last.rsplit(" in ", 1)[0]


if __name__ == "__main__":
    sys.exit(main())
