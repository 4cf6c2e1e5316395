"""Deterministic simulation of a Highwater cluster (DESIGN.md section 8, tests in tiers).

One seeded random.Random drives a discrete-event loop through the real pure logic of
brokers (Partition, Log on MemoryStorage, fetch state and truncation rules, the
synchronous ReplicaManager methods) and controllers (handlers, apply_write, the
ControllerEventLoop's commit/replay/send path) over a simulated etcd (MemoryStore),
network and clock. One file per concern:

- clock.py: the event loop, simulated time, node pause/crash, the trace;
- network.py: RPCs as messages with delay, loss, duplication, partitions;
- sim_etcd.py: MemoryStore on the sim clock, per-process clients, leases;
- sim_broker.py / sim_controller.py: the asyncio glue of the services, re-done as
  timers and callbacks around the real rules;
- liveness.py: the brokers' liveness streams to the active controller and the controller's
  fast failure path (the shipped BrokerConnections and revoke_broker_incarnation);
- workload.py: producers (acks=all, acks=1, idempotent), consumers, operator;
- faults.py: what goes wrong, and when;
- checker.py: the invariants after every step and the history check at the end;
- known_issues.py: bugs found and not fixed yet, and their signatures;
- simulation.py: one run from one seed; run.py: the command line;
- config.py: every bound and rate, the fault profiles, the safety switches.

    python -m tests.sim.run --seeds 1000 --start 0
"""
