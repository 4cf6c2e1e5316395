"""Run many simulation seeds from the command line and report failures and throughput.

    python -m tests.sim.run --seeds 1000 --start 0
    python -m tests.sim.run --seed 17 --trace-lines 400        # one seed, longer trace
    python -m tests.sim.run --seeds 200 --no-epoch-truncation  # a safety mechanism off
    python -m tests.sim.run --seeds 200 --profile transactions # tests/sim/txn_simulation.py

Prints every failing seed with its trace, then seeds per minute and simulated seconds
per wall-clock second. Exit status 1 when any seed failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time

from tests.sim.clock import TRACE_LINES_DEFAULT
from tests.sim.config import PROFILES, Safety, SimConfig
from tests.sim.simulation import SimResult, SimulationFailure, run_seed
from tests.sim.txn_simulation import TXN_PROFILE, run_txn_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.sim.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run (default 100)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seed", type=int, default=None, help="run only this seed")
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="default",
        help="fault mix (default: default; see tests/sim/config.py PROFILES)",
    )
    parser.add_argument("--fault-phase-ms", type=int, default=None, help="length of the fault phase")
    parser.add_argument("--brokers", type=int, default=None, help="brokers (default: the seed picks 3..5)")
    parser.add_argument(
        "--power-loss-fraction",
        type=float,
        default=None,
        help="share of broker crashes that lose unflushed bytes (default: SimConfig's)",
    )
    parser.add_argument(
        "--trace-lines",
        type=int,
        default=TRACE_LINES_DEFAULT,
        help=f"trace lines shown for a failure (default {TRACE_LINES_DEFAULT})",
    )
    parser.add_argument(
        "--no-epoch-truncation",
        action="store_true",
        help="followers truncate to their HW (pre-KIP-101) instead of by leader epoch",
    )
    parser.add_argument(
        "--no-controller-fence",
        action="store_true",
        help="etcd ignores the controller-epoch compare of controller writes",
    )
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first failing seed")
    parser.add_argument("-q", "--quiet", action="store_true", help="print failures and the summary only")
    args = parser.parse_args(argv)
    # The services log every failover at WARNING; in a simulation those are the point, not news.
    logging.getLogger("highwater").setLevel(logging.CRITICAL)

    config = dataclasses.replace(
        PROFILES[args.profile],
        safety=Safety(
            leader_epoch_truncation=not args.no_epoch_truncation,
            controller_epoch_fence=not args.no_controller_fence,
        ),
    )
    if args.fault_phase_ms is not None:
        config = dataclasses.replace(config, fault_phase_ms=args.fault_phase_ms)
    if args.power_loss_fraction is not None:
        config = dataclasses.replace(config, power_loss_fraction=args.power_loss_fraction)
    if args.brokers is not None:
        config = dataclasses.replace(config, brokers=args.brokers)
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))

    started = time.perf_counter()
    cpu_started = time.process_time()
    simulated_ms = 0
    failed: list[int] = []
    known: list[int] = []  # failures explained by a known, reported bug
    for seed in seeds:
        try:
            result = run_one(seed, config, args.profile, args.trace_lines, args.quiet)
        except SimulationFailure as failure:
            failed.append(seed)
            if failure.known_issue:
                known.append(seed)
            simulated_ms += failure.at_ms
            print(failure, file=sys.stderr)
            print(file=sys.stderr)
            if args.stop_on_failure:
                break
            continue
        simulated_ms += result.simulated_ms
        if not args.quiet:
            print(
                f"seed {seed}: ok  {result.shape.brokers} brokers {result.shape.controllers} controllers  "
                f"{result.simulated_ms / 1000:.0f} s simulated in {result.wall_s:.2f} s  "
                f"{result.events} events  {result.faults} faults  acks=all {result.acks_all}  "
                f"acks=1 {result.acks_one}  consumed {result.records_consumed}  "
                f"truncations checked {result.truncations_checked}  topics deleted {result.topics_deleted}  "
                f"log start resets {result.log_start_resets}  liveness revocations "
                f"{result.liveness_revocations} ({result.liveness_revocations_alive} alive)  "
                f"trace {result.trace_digest}"
            )
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    ran = len(seeds) if not args.stop_on_failure or not failed else seeds.index(failed[-1]) + 1
    unknown = [s for s in failed if s not in known]
    print(
        f"{ran} seeds, {len(failed)} failed{': ' + ' '.join(map(str, failed)) if failed else ''}"
        f"{f' ({len(known)} by known issues, new: ' + (' '.join(map(str, unknown)) or 'none') + ')' if known else ''}; "  # noqa: E501
        f"{ran / wall_s * 60:.0f} seeds/minute, {simulated_ms / 1000 / wall_s:.0f} simulated s per wall s "
        f"({wall_s:.1f} s wall; {simulated_ms / 1000 / cpu_s:.0f} simulated s per CPU s)"
    )
    return 1 if failed else 0


def run_one(seed: int, config: SimConfig, profile: str, trace_lines: int, quiet: bool) -> SimResult:
    """One seed of the profile: the transactional profile runs its own simulation (and prints
    what its history held)."""
    if profile != TXN_PROFILE:
        return run_seed(seed, config, trace_lines_max=trace_lines)
    txn = run_txn_seed(seed, config, trace_lines_max=trace_lines)
    c = txn.counts
    if not quiet:
        print(
            f"seed {seed}: transactions began {c.began} committed {c.committed} aborted {c.aborted} "
            f"unknown {c.unknown}  records seen {c.records_seen}  zombie appends {c.zombie_writes}  "
            f"LSO checks {c.lso_checks}  coordinator deaths {sum(txn.coordinator_deaths.values())}"
        )
    return txn.sim


if __name__ == "__main__":
    sys.exit(main())
