"""Request signing shared by the broker's ACL check and StrataMQ's own clients.

The official RocketMQ 5 clients sign every gRPC call with two metadata entries::

    x-mq-date-time: 20240101T120000Z
    authorization:  MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time,
                    Signature=<hex HMAC-SHA1(secretKey, x-mq-date-time value)>

``stratamq.broker.acl`` verifies exactly this; ``stratamq.client.admin`` (``stratamq topic``,
``stratamq group``) produces it with ``auth_metadata``, so one function defines the signature
for both sides and they cannot drift apart. No gRPC and no I/O here.
"""

from __future__ import annotations

import hmac
import time
from hashlib import sha1

__all__ = ["ALGORITHM", "AUTHORIZATION_HEADER", "DATE_FORMAT", "DATE_TIME_HEADER",
           "auth_metadata", "parse_authorization", "sign"]

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_HEADER = "x-mq-date-time"
AUTHORIZATION_HEADER = "authorization"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"


def sign(secret_key: str, date_time: str) -> str:
    """The client's signature: hex HMAC-SHA1 of the date-time header keyed by the secret."""
    return hmac.new(secret_key.encode(), date_time.encode(), sha1).hexdigest()


def auth_metadata(access_key: str, secret_key: str,
                  now: float | None = None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata signing one call as ``access_key``, stamped ``now`` (default: the clock).

    The stamp is UTC, as the Java client sends it (the broker also accepts the Python client's
    local time labelled ``Z``).
    """
    stamp = time.strftime(DATE_FORMAT, time.gmtime(time.time() if now is None else now))
    return ((DATE_TIME_HEADER, stamp),
            (AUTHORIZATION_HEADER, f"{ALGORITHM} Credential={access_key}, "
                                   f"SignedHeaders={DATE_TIME_HEADER}, "
                                   f"Signature={sign(secret_key, stamp)}"))


def parse_authorization(value: str) -> tuple[str, dict[str, str]]:
    """``"MQv2-HMAC-SHA1 Credential=ak, ..."`` -> (algorithm, {lower-case field: value})."""
    algorithm, _, rest = value.strip().partition(" ")
    fields = {}
    for part in rest.split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            fields[key.strip().lower()] = val.strip()
    return algorithm, fields
