"""services/groups/errors.py: one group error vocabulary for both protocols, mapped once to the wire.

Every member has a Kafka wire code, the one its name says (Kafka's Errors.java names); every
code the gateway's group calls answer has a message; and the two sides' old names are the
same enum, so a classic answer and a KIP-848 refusal cannot mean different things by one name.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from protos.highwater.v1 import common_pb2
from services.gateway.groups import GROUP_ERROR_CODES, GROUP_ERROR_MESSAGES
from services.groups import coordinator, offset_commits
from services.groups.errors import KAFKA_CODES, GroupError, kafka_code
from services.kafka import classic_groups


def test_every_group_error_maps_to_the_kafka_wire_code_of_its_name() -> None:
    assert set(KAFKA_CODES) == set(GroupError)
    for error in GroupError:
        assert kafka_code(error) is ErrorCode[error.name.lower()], error
    assert kafka_code(GroupError.NONE) is ErrorCode.none
    # Only NONE is "no error": every other member answers a non-zero code.
    assert [e for e in GroupError if kafka_code(e).value == 0] == [GroupError.NONE]


def test_the_wire_codes_are_kafkas_numbers() -> None:
    """A few spot checks against Kafka's protocol numbers, so a table edit cannot swap two."""
    numbers = {
        GroupError.ILLEGAL_GENERATION: 22,
        GroupError.UNKNOWN_MEMBER_ID: 25,
        GroupError.REBALANCE_IN_PROGRESS: 27,
        GroupError.MEMBER_ID_REQUIRED: 79,
        GroupError.NON_EMPTY_GROUP: 68,
        GroupError.FENCED_MEMBER_EPOCH: 110,
        GroupError.STALE_MEMBER_EPOCH: 113,
    }
    assert {e: kafka_code(e).value for e in numbers} == numbers


def test_both_protocols_speak_the_one_enum() -> None:
    assert classic_groups.Error is GroupError
    assert coordinator.GroupError is GroupError


def test_every_grpc_mapped_error_has_a_code_of_its_name_and_a_message() -> None:
    for error, code in GROUP_ERROR_CODES.items():
        assert common_pb2.ErrorCode.Name(code) == error.name, error
        assert error is GroupError.NON_EMPTY_GROUP or GROUP_ERROR_MESSAGES[error], error
    # A refused commit names a group error, or is the one refusal with no group error (a
    # group that kept changing answers REQUEST_TIMED_OUT).
    for refusal in offset_commits.CommitRefusal:
        if refusal is not offset_commits.CommitRefusal.GROUP_KEPT_CHANGING:
            assert GroupError(refusal.value) in GROUP_ERROR_CODES, refusal
