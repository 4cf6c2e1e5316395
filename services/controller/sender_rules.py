"""When the controller sends a control request again (Kafka's RequestSendThread retry rule): pure.

A control request (LeaderAndIsr, UpdateMetadata, StopReplica) goes to one
incarnation of a broker: its address and broker epoch. The sender for that
incarnation asks again, after a growing pause, while

- the call failed in transport (the broker is slow or restarting), at most
  CONTROL_RPC_ATTEMPTS_MAX times: a broker that stays unreachable loses its lease
  and its sender goes with it;
- the broker refused it as not ready (BROKER_NOT_AVAILABLE: not registered yet, or
  stopping) or as meant for another incarnation (STALE_BROKER_EPOCH): for as long as
  the incarnation lasts. The refusal is not the end of the request: counting it as
  delivered left a restarted broker following nothing (issue 16, defect 1). When
  the broker re-registers, the controller replaces the sender, dropping what was
  queued for the old incarnation, and tells the new one its state afresh.

Any other answer, error or not, ends the request.
"""

from __future__ import annotations

from protos.highwater.v1 import common_pb2

# A control RPC that failed in transport is tried this many times in all.
CONTROL_RPC_ATTEMPTS_MAX = 5
# The pause before attempt n + 1 is n times this, up to the maximum.
CONTROL_RPC_RETRY_BACKOFF_MS = 100
CONTROL_RPC_RETRY_BACKOFF_MS_MAX = 1_000
# Refusals that name a passing state of the broker, not a wrong request.
RETRIABLE_REFUSALS = frozenset({common_pb2.BROKER_NOT_AVAILABLE, common_pb2.STALE_BROKER_EPOCH})


def retry_after_ms(attempt: int, *, error_code: int | None) -> int | None:
    """The pause before sending attempt `attempt` + 1, or None when the request is done.

    error_code is the answer's top-level error code, or None when the call itself
    failed (deadline, connection refused).
    """
    pause_ms = min(CONTROL_RPC_RETRY_BACKOFF_MS * attempt, CONTROL_RPC_RETRY_BACKOFF_MS_MAX)
    if error_code is None:
        return pause_ms if attempt < CONTROL_RPC_ATTEMPTS_MAX else None
    if error_code in RETRIABLE_REFUSALS:
        return pause_ms
    return None
