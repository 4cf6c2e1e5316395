"""Consumer groups: the pure logic of a KIP-848 group coordinator.

`assignors.py` turns subscriptions and partition counts into a target assignment;
`coordinator.py` keeps one group's members, epochs and reconciliation toward that target.
Neither does I/O: the caller passes time-derived decisions (session expiry) and fresh ids
in, stores `GroupState.to_record()` in etcd, and writes only when an answer says
`changed`.
"""
