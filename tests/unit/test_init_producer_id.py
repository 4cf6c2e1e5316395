"""InitProducerId's request rules (the fuzz run once found an int32 epoch that overflowed the answer)."""

from __future__ import annotations

import pytest

from protos.highwater.v1 import common_pb2
from services.common import limits
from services.common.request_checks import init_producer_id_problem


@pytest.mark.parametrize(
    ("producer_id", "producer_epoch", "says"),
    [
        (-1, 2**31 - 1, "int16"),
        (-1, 3, "sends producer_epoch -1"),
        (7, 2**31 - 1, "int16"),
        (7, -2, "int16"),
        (7, limits.PRODUCER_EPOCH_MAX + 1, "int16"),
        (-5, -1, "producer_id must be -1"),
    ],
)
def test_ids_and_epochs_a_batch_header_cannot_hold_are_refused(
    producer_id: int, producer_epoch: int, says: str
) -> None:
    problem = init_producer_id_problem(
        common_pb2.InitProducerIdRequest(producer_id=producer_id, producer_epoch=producer_epoch)
    )
    assert problem is not None and says in problem


def test_a_transactional_id_is_refused_with_the_reason() -> None:
    problem = init_producer_id_problem(
        common_pb2.InitProducerIdRequest(transactional_id="tx", producer_id=-1, producer_epoch=-1)
    )
    assert problem is not None and "Kafka listener" in problem


@pytest.mark.parametrize(
    ("producer_id", "producer_epoch"), [(-1, -1), (7, 0), (7, -1), (7, limits.PRODUCER_EPOCH_MAX)]
)
def test_new_producers_and_epoch_bumps_pass(producer_id: int, producer_epoch: int) -> None:
    assert (
        init_producer_id_problem(
            common_pb2.InitProducerIdRequest(producer_id=producer_id, producer_epoch=producer_epoch)
        )
        is None
    )
