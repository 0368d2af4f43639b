"""Request checks as Apache RocketMQ 5's gRPC proxy makes them, free of I/O.

Each function raises ``BrokerError`` with the ``Code`` and the wording the proxy uses
(``GrpcValidator``, ``Validators``, the ``*Activity`` classes), so the six official clients,
which each react to different codes, see what they see in front of a RocketMQ proxy. Limits
that are settings in RocketMQ's ``ProxyConfig`` are the defaults named here.
"""

from __future__ import annotations

import hashlib
import re
import zlib

from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.errors import BrokerError
from stratamq.broker.metadata import is_system_topic
from stratamq.names import GROUP_MAX_LENGTH, NAME_CHARS, TOPIC_MAX_LENGTH, is_valid_name
from stratamq.store.results import PutMessageStatus

Code = pb.Code

__all__ = ["check_topic", "check_group", "check_invisible_time", "has_control_character",
           "body_checksum", "body_digest", "check_body_digest", "client_type_name", "put_status",
           "RECEIVE_BATCH_MAX", "MAX_USER_PROPERTY_SIZE", "USER_PROPERTY_MAX_NUM",
           "MAX_MESSAGE_GROUP_SIZE"]

# ProxyConfig defaults.
MAX_USER_PROPERTY_SIZE = 16 * 1024  # bytes of user property names + values + tag + keys
USER_PROPERTY_MAX_NUM = 128
MAX_MESSAGE_GROUP_SIZE = 64  # bytes; a group of this size or more is refused
# PopMessageProcessor: "pop message's num is greater than 32".
RECEIVE_BATCH_MAX = 32
# MixAll.isSysConsumerGroup.
_SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"
# Java's Character.isISOControl (Guava's CharMatcher.javaIsoControl), the proxy's test.
_ISO_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def has_control_character(text: str) -> bool:
    return _ISO_CONTROL.search(text) is not None


def _name_problem(what: str, name: str, max_length: int) -> str | None:
    """Validators.checkTopic / checkGroup, in their order and words."""
    if not name.strip():
        return f"The specified {what} is blank."
    if len(name) > max_length:
        return f"The specified {what} is longer than {what} max length {max_length}."
    if not is_valid_name(name):
        return (f"The specified {what}[{name[:300]}] contains illegal characters, allowing "
                f"only ^[{NAME_CHARS}]+$")
    return None


# Topic names that passed check_topic: every request names one (twice for a send), a broker
# sees few, and the checks (a regular expression among them) were a visible share of a send.
_GOOD_TOPICS: set[str] = set()
_GOOD_TOPICS_MAX = 10_000


def check_topic(name: str) -> None:
    """GrpcValidator.validateTopic: ILLEGAL_TOPIC for a bad or a system topic name."""
    if name in _GOOD_TOPICS:
        return
    problem = _name_problem("topic", name, TOPIC_MAX_LENGTH)
    if problem is not None:
        raise BrokerError(Code.ILLEGAL_TOPIC, problem)
    if is_system_topic(name):
        raise BrokerError(Code.ILLEGAL_TOPIC, "cannot access system topic")
    if len(_GOOD_TOPICS) < _GOOD_TOPICS_MAX:
        _GOOD_TOPICS.add(name)


def check_group(name: str) -> None:
    """GrpcValidator.validateConsumerGroup: ILLEGAL_CONSUMER_GROUP for a bad or system name."""
    problem = _name_problem("group", name, GROUP_MAX_LENGTH)
    if problem is not None:
        raise BrokerError(Code.ILLEGAL_CONSUMER_GROUP, problem)
    if name.startswith(_SYSTEM_GROUP_PREFIX):
        raise BrokerError(Code.ILLEGAL_CONSUMER_GROUP, "cannot use system consumer group")


def check_invisible_time(ms: int, min_ms: int, max_ms: int) -> None:
    """GrpcValidator.validateInvisibleTime: ``min_ms`` is 0 except for a receive."""
    if ms < min_ms:
        raise BrokerError(Code.ILLEGAL_INVISIBLE_TIME,
                          f"the invisibleTime is too small. min is {min_ms}")
    if max_ms > 0 and ms > max_ms:
        raise BrokerError(Code.ILLEGAL_INVISIBLE_TIME,
                          f"the invisibleTime is too large. max is {max_ms}")


def body_digest(body: bytes) -> pb.Digest:
    """The digest the proxy sends with every message: MD5, upper-case hex (GrpcConverter).

    The clients all check MD5 the same way, while each formats CRC32 differently; a digest a
    client cannot match makes it treat every message as corrupted."""
    return pb.Digest(type=pb.MD5, checksum=body_checksum(body))


def body_checksum(body: bytes) -> str:
    """The checksum of ``body_digest`` (set in place where a message is built field by field)."""
    return hashlib.md5(body).hexdigest().upper()


def _crc32_spellings(body: bytes) -> set[str]:
    """CRC32 as the clients write it: hex (padded or not; case is ignored by the caller),
    unsigned decimal (PHP's ``crc32``), signed decimal (Java's ``int``)."""
    crc = zlib.crc32(body)
    return {f"{crc:08X}", f"{crc:X}", str(crc), str(crc - (1 << 32) if crc >= 1 << 31 else crc)}


_DIGESTS = {pb.MD5: ("MD5", lambda body: {hashlib.md5(body).hexdigest().upper()}),
            pb.SHA1: ("SHA1", lambda body: {hashlib.sha1(body).hexdigest().upper()}),
            pb.CRC32: ("CRC32", _crc32_spellings)}


def check_body_digest(digest: pb.Digest, body: bytes) -> None:
    """A sent message's ``body_digest`` against its body (the bytes as sent): MESSAGE_CORRUPTED
    when they differ. RocketMQ's proxy does not look at this field (it stores the body and
    computes its own MD5 for consumers), so a body damaged on its way would be stored and
    served with a digest that matches the damage; StrataMQ refuses it with the code the
    proxy gives a malformed send. No digest (type unspecified): nothing to check."""
    if digest.type == pb.DIGEST_TYPE_UNSPECIFIED:
        return
    known = _DIGESTS.get(digest.type)
    if known is None:
        raise BrokerError(Code.BAD_REQUEST, f"unknown body digest type {digest.type}")
    name, compute = known
    sent = digest.checksum.strip().upper()
    if sent not in compute(body):
        raise BrokerError(Code.MESSAGE_CORRUPTED,
                          f"message body does not match its {name} digest: the request says "
                          f"{digest.checksum[:80]!r}, the {len(body)}-byte body received has "
                          f"{min(compute(body))}; it was damaged on its way, nothing stored")


def client_type_name(client_type: int) -> str:
    """The ClientType's name, or UNRECOGNIZED_CLIENT_TYPE as the proxy answers."""
    if client_type == pb.CLIENT_TYPE_UNSPECIFIED or client_type not in pb.ClientType.values():
        raise BrokerError(Code.UNRECOGNIZED_CLIENT_TYPE,
                          f"unrecognized client type {client_type}")
    return pb.ClientType.Name(client_type)


# What a client gets for each store status: the code RocketMQ's proxy answers for the response
# code its broker's SendMessageProcessor sets (the proxy's ResponseBuilder turns SYSTEM_BUSY
# into TOO_MANY_REQUESTS, and broker errors it has no mapping for into INTERNAL_SERVER_ERROR),
# with the broker's explanation, so "disk full" says so instead of a bare internal error.
_PUT_STATUS: dict[PutMessageStatus, tuple[int, str]] = {
    PutMessageStatus.PUT_OK: (Code.OK, "OK"),
    PutMessageStatus.FLUSH_DISK_TIMEOUT: (
        Code.MASTER_PERSISTENCE_TIMEOUT, "send message failed, sendStatus=FLUSH_DISK_TIMEOUT"),
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: (
        Code.SLAVE_PERSISTENCE_TIMEOUT, "send message failed, sendStatus=FLUSH_SLAVE_TIMEOUT"),
    PutMessageStatus.SLAVE_NOT_AVAILABLE: (
        Code.HA_NOT_AVAILABLE, "send message failed, sendStatus=SLAVE_NOT_AVAILABLE"),
    PutMessageStatus.SERVICE_NOT_AVAILABLE: (
        Code.INTERNAL_SERVER_ERROR, "service not available now. It may be caused by one of the "
        "following reasons: the broker's disk is full, messages are put to the slave, message "
        "store has been shut down"),
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: (
        Code.INTERNAL_SERVER_ERROR, "create mapped file failed, server is busy or broken."),
    PutMessageStatus.MESSAGE_ILLEGAL: (
        Code.BAD_REQUEST, "the message is illegal, maybe msg body or properties length not "
        "matched."),
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: (
        Code.MESSAGE_PROPERTIES_TOO_LARGE, "the message properties are too long."),
    PutMessageStatus.OS_PAGE_CACHE_BUSY: (
        Code.TOO_MANY_REQUESTS, "[PC_SYNCHRONIZED]broker busy, start flow control for a while"),
    PutMessageStatus.UNKNOWN_ERROR: (Code.INTERNAL_SERVER_ERROR, "UNKNOWN_ERROR"),
}


def put_status(status: PutMessageStatus) -> tuple[int, str]:
    """The (code, message) a client gets for a put that ended in ``status``."""
    return _PUT_STATUS[status]
