"""Controller election and controller fencing (DESIGN.md section 2).

Election is one etcd transaction: if `/controller` is missing and `/controller_epoch`
is unchanged since it was read, put `/controller` with my lease and bump
`/controller_epoch`. Losers watch `/controller` and try again when it is deleted
(the active controller resigned, or its lease expired). The campaign's rules (the order
of its steps, the back-off, revoking a lease whose claim had an unknown outcome) are pure,
in coordinator/controller_life.py; `ControllerElection.campaign` is their asyncio driver,
and `perform_step` turns their etcd steps into etcd calls in values.py's formats for both
drivers (this one and the simulation's, tests/sim/sim_controller.py).

Fencing: every write of a controller is a transaction that also compares
`/controller_epoch` with the controller's own epoch and requires `/controller` to
exist (`fenced_txn`). A controller deposed while it was paused or partitioned
therefore writes nothing: its transactions fail with ControllerFenced, and it must
stop acting. The second compare matters when the controller's lease has expired but
nobody else has won yet: `/controller_epoch` still holds its epoch, and without it a
controller resuming from a pause committed a decision made on a stale view of the
cluster (an ISR expansion naming a broker that had since lost its log), then won the
next election itself and elected that broker leader: acknowledged records were lost
(simulation seed 126, tests/sim/test_liveness.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from coordinator import controller_life, values
from coordinator.keys import Keys
from coordinator.lease import LeaseKeeper, OnLost
from coordinator.store import (
    Compare,
    CoordinatorError,
    CoordinatorUnavailable,
    Get,
    MetadataStore,
    Op,
    Put,
    TxnResult,
    WatchCompacted,
    compare_missing,
    compare_mod_revision,
    compare_value,
)

log = logging.getLogger("highwater.coordinator")


class ControllerFenced(CoordinatorError):
    """A controller write carried an epoch older than `/controller_epoch` (a newer controller
    exists), or its lease expired (`/controller` is gone)."""

    def __init__(self, epoch: int, current_epoch: int | None, *, lease_expired: bool = False) -> None:
        if lease_expired:
            why = f"/controller is gone (its lease expired; /controller_epoch is {current_epoch})"
        else:
            why = f"/controller_epoch is now {current_epoch}"
        super().__init__(f"controller epoch {epoch} is stale: {why}; this controller must stop acting")
        self.epoch = epoch
        self.current_epoch = current_epoch


def fenced_compares(keys: Keys, epoch: int) -> list[Compare]:
    """The guards every controller write carries: `/controller_epoch` still equals epoch, and
    `/controller` still exists (the lease that holds it has not expired)."""
    return [
        compare_value(keys.controller_epoch, values.encode_controller_epoch(epoch)),
        Compare(keys.controller, "version", ">", 0),
    ]


async def fenced_txn(
    store: MetadataStore,
    epoch: int,
    compares: Sequence[Compare],
    ops: Sequence[Op],
    failure: Sequence[Op] = (),
) -> TxnResult:
    """A controller write: ops run only if the controller still holds epoch and every compare holds.

    Returns the TxnResult (succeeded False when one of the caller's own compares
    failed; its gets are those of `failure`). Raises ControllerFenced when a fencing
    compare failed (told apart by reading `/controller_epoch` and `/controller` in the
    failure branch), plus whatever store.txn raises.
    """
    keys = store.keys
    result = await store.txn(
        [*fenced_compares(keys, epoch), *compares],
        ops,
        [*failure, Get(keys.controller_epoch), Get(keys.controller)],
    )
    if result.succeeded:
        return result
    epoch_kvs, controller_kvs = result.gets[-2], result.gets[-1]
    current_epoch = int(epoch_kvs[0].value) if epoch_kvs else None
    if current_epoch != epoch or not controller_kvs:
        raise ControllerFenced(epoch, current_epoch, lease_expired=not controller_kvs)
    return TxnResult(succeeded=False, revision=result.revision, gets=result.gets[:-2])


async def current_controller(store: MetadataStore) -> dict[str, Any] | None:
    """The active controller's `/controller` value ({"controller_id", "epoch", "host", "port", ...}),
    or None.
    """
    kv = await store.get(store.keys.controller)
    if kv is None:
        return None
    return values.decode_controller(kv.value)


async def revoke_controller_term(store: MetadataStore, epoch: int) -> bool:
    """Revoke the lease holding `/controller` if it still names controller epoch `epoch`.

    A standby's fast path for an active controller whose connections reset and did not come
    back (services/controller/standby_watch.py): `/controller` goes at once and the election
    runs, instead of a lease TTL later. Reading the key and then revoking the lease it names
    cannot depose a later controller: a later epoch holds a lease of its own. A controller that
    was in fact alive is fenced by its epoch, as when its lease expires. Returns whether a lease
    was revoked (False: the key is gone, or names another epoch).
    """
    kv = await store.get(store.keys.controller)
    if kv is None or not kv.lease or values.decode_controller(kv.value).get("epoch") != epoch:
        return False
    await store.revoke_lease(kv.lease)
    return True


async def perform_step(
    store: MetadataStore, step: controller_life.ReadElection | controller_life.Claim
) -> controller_life.ElectionView | controller_life.Claimed:
    """The etcd steps of a campaign (coordinator/controller_life.py) as etcd calls, in etcd's
    value formats (values.py). Both drivers use it: ControllerElection here, and the simulation
    on its simulated etcd. Raises whatever the store raises (CoordinatorUnavailable when etcd
    could not be reached)."""
    keys = store.keys
    if isinstance(step, controller_life.ReadElection):
        snapshot = await store.txn([], [Get(keys.controller), Get(keys.controller_epoch)])
        controller_kvs, epoch_kvs = snapshot.gets
        epoch_kv = epoch_kvs[0] if epoch_kvs else None
        return controller_life.ElectionView(
            holder=values.decode_controller(controller_kvs[0].value) if controller_kvs else None,
            epoch=values.decode_controller_epoch(epoch_kv.value) if epoch_kv is not None else 0,
            epoch_mod_revision=epoch_kv.mod_revision if epoch_kv is not None else 0,
            revision=snapshot.revision,
        )
    result = await store.txn(
        [
            compare_missing(keys.controller),
            compare_mod_revision(keys.controller_epoch, step.epoch_mod_revision)
            if step.epoch_mod_revision
            else compare_missing(keys.controller_epoch),
        ],
        [
            Put(keys.controller, values.encode_controller(dict(step.value)), lease=step.lease_id),
            Put(keys.controller_epoch, values.encode_controller_epoch(step.epoch)),
        ],
    )
    return controller_life.Claimed(succeeded=result.succeeded, revision=result.revision)


class ControllerElection:
    """One candidate's campaign for the controller role.

    The task that calls campaign() owns this object. After campaign() returns the
    epoch, `lost` is set if the lease is lost; from then on the controller must stop
    acting (its writes would fail ControllerFenced anyway once another one wins).
    """

    def __init__(
        self,
        store: MetadataStore,
        controller_id: int,
        info: dict[str, Any],
        ttl_s: int,
        *,
        keepalive_interval_s: float | None = None,
        on_lost: OnLost | None = None,
    ) -> None:
        self.store = store
        self.controller_id = controller_id
        self.info = info
        self.ttl_s = ttl_s
        self.keepalive_interval_s = keepalive_interval_s
        self.on_lost = on_lost
        self.epoch: int | None = None
        # The etcd revision of the election transaction that won `epoch`: every write of the
        # previous controller is at or below it (a warm standby catches up to it).
        self.won_revision = 0
        self._keeper: LeaseKeeper | None = None
        # Leases granted by the campaign and not yet taken into office or revoked.
        self._granted: dict[int, LeaseKeeper] = {}
        self._lost = asyncio.Event()
        self._resigned = False

    @property
    def lost(self) -> asyncio.Event:
        """Set when the lease of the won term is lost (not on resign()). A new term gets a new event."""
        return self._lost

    @property
    def is_controller(self) -> bool:
        return self.epoch is not None and not self._resigned and not self._lost.is_set()

    @property
    def lease(self) -> LeaseKeeper | None:
        return self._keeper

    def fenced(self, epoch: int | None = None) -> list[Compare]:
        """The fencing compares for epoch (default: the epoch this candidate won)."""
        if epoch is None:
            if self.epoch is None:
                raise RuntimeError(
                    f"controller {self.controller_id} has not won an election: no epoch to fence with"
                )
            epoch = self.epoch
        return fenced_compares(self.store.keys, epoch)

    async def campaign(self) -> int:
        """Wait until this candidate is the controller; returns the new controller epoch.

        Drives controller_life.campaign: retries with back-off while etcd is unreachable
        (logging each failure); to give up, cancel the task. Raises ValueError for a bad
        TTL/interval.
        """
        if self.is_controller:
            raise RuntimeError(f"controller {self.controller_id} already holds epoch {self.epoch}")
        steps = controller_life.campaign(self.controller_id, self.info, self.ttl_s)
        step = next(steps)
        while True:
            try:
                answer = await self._perform(step)
            except CoordinatorUnavailable as exc:
                answer = controller_life.Unreachable(str(exc))
            except BaseException as exc:
                step = steps.throw(exc)  # the campaign revokes a lease of unknown outcome, then re-raises
                continue
            try:
                step = steps.send(answer)
            except StopIteration as done:
                return self._took_office(done.value)

    async def _perform(self, step: controller_life.ElectionStep) -> object:
        if isinstance(step, controller_life.AwaitControllerGone):
            log.info(
                "controller %d: controller %s holds epoch %s; waiting for it to go",
                self.controller_id,
                step.holder.get("controller_id"),
                step.holder.get("epoch"),
            )
            try:
                await self._wait_for_controller_delete(step.start_revision)
            except WatchCompacted as exc:
                # etcd compacted the history the watch needed: whether the holder went meanwhile
                # is unknown, so read the election again (the campaign's answer to the holder
                # going, None); it waits again from a fresh revision if the holder is still there.
                log.info("controller %d: %s; reading the election again", self.controller_id, exc)
            return None
        if isinstance(step, controller_life.GrantLease):
            self._lost = asyncio.Event()
            keeper = LeaseKeeper(on_lost=self._on_lease_lost, name=f"controller {self.controller_id}")
            lease_id = await keeper.start(
                self.store, step.ttl_s, keepalive_interval_s=self.keepalive_interval_s
            )
            self._granted[lease_id] = keeper
            return lease_id
        if isinstance(step, controller_life.RevokeLease):
            await self._granted.pop(step.lease_id).stop(revoke=True)
            return None
        if isinstance(step, controller_life.Pause):
            log.warning(
                "controller %d: election attempt failed (%s); retrying in %.1f s",
                self.controller_id,
                step.why,
                step.seconds,
            )
            await asyncio.sleep(step.seconds)
            return None
        answer = await perform_step(self.store, step)
        claim_lost = isinstance(answer, controller_life.Claimed) and not answer.succeeded
        if isinstance(step, controller_life.Claim) and claim_lost:
            log.info("controller %d: lost the race for epoch %d", self.controller_id, step.epoch)
        return answer

    def _took_office(self, won: controller_life.Won) -> int:
        self._keeper = self._granted.pop(won.lease_id)
        self._resigned = False
        self.epoch = won.epoch
        self.won_revision = won.revision
        log.info(
            "controller %d: elected with controller epoch %d (lease %x)",
            self.controller_id,
            won.epoch,
            won.lease_id,
        )
        return won.epoch

    async def _wait_for_controller_delete(self, start_revision: int) -> None:
        key = self.store.keys.controller
        # A prefix watch on /controller also sees /controller_epoch: match the key exactly.
        async with contextlib.aclosing(
            self.store.watch_prefix(key, start_revision=start_revision)
        ) as events_stream:
            async for events in events_stream:
                if any(e.key == key and e.kind == "delete" for e in events):
                    return

    def _on_lease_lost(self) -> object:
        log.error(
            "controller %d: lease lost; controller epoch %s must stop acting", self.controller_id, self.epoch
        )
        self._lost.set()
        return self.on_lost() if self.on_lost is not None else None

    async def resign(self) -> None:
        """Give up the role: revoke the lease, deleting /controller so a standby takes over."""
        keeper, self._keeper = self._keeper, None
        self._resigned = True
        if keeper is not None:
            await keeper.stop(revoke=True)
            log.info("controller %d: resigned controller epoch %s", self.controller_id, self.epoch)
