"""Access control: verify the client's signature, then check topic and group permissions.

Pure logic, no gRPC: the server hands in the request's metadata as ``(key, value)`` pairs and
gets back the account, or a ``BrokerError`` with ``Code.UNAUTHORIZED`` (who are you?) or
``Code.FORBIDDEN`` (you may not do that).

Authentication follows what the official 5.x clients send on every RPC (the signature itself
is defined once, in ``stratamq.signature``, which StrataMQ's admin client signs with too)::

    x-mq-date-time: 20240101T120000Z
    authorization:  MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time,
                    Signature=<hex HMAC-SHA1(secretKey, x-mq-date-time value)>

A signature over a date-time further than ``aclSignatureWindowSec`` from now is refused, so a
captured header cannot be replayed for long. The Python client formats *local* time with a
``Z`` suffix (``datetime.now()``), the Java client UTC; a stamp is accepted if it is within the
window read either way.

Permissions follow RocketMQ 4's ``plain_acl.yml`` model (``aclFile`` is that YAML file, or
the same fields as JSON): per account ``admin``, ``defaultTopicPerm``, ``defaultGroupPerm``
and lists ``topicPerms`` / ``groupPerms`` of ``name=PERM`` with PERM one of DENY, PUB, SUB, PUB|SUB
(ANY). Publishing needs PUB on the topic; receiving needs SUB on the topic *and* on the
group; admin operations (topic/group create, update, delete) need ``admin``. An admin account
may do everything. Missing defaults are DENY.

Thread-safety: an ``AclChecker`` is immutable after construction; call it from any thread.
"""

from __future__ import annotations

import calendar
import hmac
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntFlag, StrEnum
from pathlib import Path
from typing import Any

from rocketmq.grpc_protocol import definition_pb2

from stratamq.broker.errors import BrokerError
from stratamq.signature import (
    ALGORITHM,
    AUTHORIZATION_HEADER,
    DATE_TIME_HEADER,
    parse_authorization,
    sign,
)
from stratamq.signature import DATE_FORMAT as _DATE_FORMAT

__all__ = ["AclChecker", "Account", "Action", "Perm", "Resource", "ResourceKind", "sign"]

log = logging.getLogger(__name__)
UNAUTHORIZED = definition_pb2.Code.UNAUTHORIZED
_NO_SECRET = "\0 no account has this secret \0"  # signs for unknown keys; matches nothing
FORBIDDEN = definition_pb2.Code.FORBIDDEN


class Perm(IntFlag):
    DENY = 0
    PUB = 1
    SUB = 2
    ANY = PUB | SUB

    @classmethod
    def parse(cls, text: str) -> Perm:
        perm = cls.DENY
        for part in text.strip().upper().split("|"):
            part = part.strip()
            if part not in cls.__members__:
                raise ValueError(f"unknown permission {part!r} (DENY, PUB, SUB, PUB|SUB, ANY)")
            perm |= cls[part]
        return perm


class Action(StrEnum):
    PUB = "PUB"  # send to a topic
    SUB = "SUB"  # receive from a topic with a group
    ADMIN = "ADMIN"  # create/update/delete topics and groups


class ResourceKind(StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


@dataclass(frozen=True)
class Resource:
    kind: ResourceKind
    name: str

    @classmethod
    def topic(cls, name: str) -> Resource:
        return cls(ResourceKind.TOPIC, name)

    @classmethod
    def group(cls, name: str) -> Resource:
        return cls(ResourceKind.GROUP, name)

    @classmethod
    def cluster(cls, name: str = "") -> Resource:
        return cls(ResourceKind.CLUSTER, name)


@dataclass
class Account:
    access_key: str
    secret_key: str
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    topic_perms: dict[str, Perm] = field(default_factory=dict)
    group_perms: dict[str, Perm] = field(default_factory=dict)

    def perm(self, resource: Resource) -> Perm:
        if self.admin:
            return Perm.ANY
        if resource.kind is ResourceKind.TOPIC:
            return self.topic_perms.get(resource.name, self.default_topic_perm)
        if resource.kind is ResourceKind.GROUP:
            return self.group_perms.get(resource.name, self.default_group_perm)
        return Perm.DENY

    @classmethod
    def from_json(cls, raw: dict, where: str) -> Account:
        try:
            ak, sk = str(raw["accessKey"]), str(raw["secretKey"])
        except KeyError as exc:
            raise ValueError(f"{where}: missing {exc.args[0]}") from None
        if not ak or not sk:
            raise ValueError(f"{where}: accessKey and secretKey must not be empty")
        try:
            return cls(
                ak, sk, bool(raw.get("admin", False)),
                Perm.parse(raw.get("defaultTopicPerm", "DENY")),
                Perm.parse(raw.get("defaultGroupPerm", "DENY")),
                _perm_list(raw.get("topicPerms", [])), _perm_list(raw.get("groupPerms", [])),
            )  # fmt: skip
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"{where} ({ak}): {exc}") from None


def _perm_list(items: list[str]) -> dict[str, Perm]:
    out = {}
    for item in items:
        name, sep, perm = str(item).rpartition("=")
        if not sep or not name:
            raise ValueError(f"expected name=PERM, got {item!r}")
        out[name.strip()] = Perm.parse(perm)
    return out


class AclChecker:
    """Authenticates requests and authorizes actions against a fixed set of accounts."""

    def __init__(self, accounts: Iterable[Account], window_sec: int) -> None:
        self.accounts = {a.access_key: a for a in accounts}
        self.window_sec = window_sec

    @classmethod
    def from_config(cls, acl_file: str, access_key: str, secret_key: str,
                    window_sec: int) -> AclChecker:
        """Accounts from ``aclFile`` plus the one admin account ``aclAccessKey``/``aclSecretKey``.

        Raises ValueError with the file and account named if the file is malformed; an ACL
        with no account at all is refused too (it would lock every client out).
        """
        accounts: list[Account] = []
        if acl_file:
            path = Path(acl_file)
            doc = _read_acl_file(path)
            raw_accounts = doc.get("accounts") if isinstance(doc, dict) else None
            if not isinstance(raw_accounts, list):
                raise ValueError(f"aclFile {path}: expected {{\"accounts\": [...]}}")
            for i, raw in enumerate(raw_accounts):
                if not isinstance(raw, dict):
                    raise ValueError(f"aclFile {path}: account #{i} is not an object")
                accounts.append(Account.from_json(raw, f"aclFile {path}: account #{i}"))
        if access_key or secret_key:
            if not (access_key and secret_key):
                raise ValueError("aclAccessKey and aclSecretKey must be set together")
            accounts.append(Account(access_key, secret_key, admin=True))
        if not accounts:
            raise ValueError("aclEnable=true but no account: set aclFile or aclAccessKey")
        keys = [a.access_key for a in accounts]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"access keys defined twice: {', '.join(dupes)}")
        return cls(accounts, window_sec)

    # -- authentication -------------------------------------------------------------------------

    def authenticate(self, metadata: Mapping[str, str] | Iterable[tuple[str, str | bytes]],
                     now: float | None = None) -> Account:
        """The account whose secret signed this request; BrokerError(UNAUTHORIZED) if none."""
        headers: dict[str, str] = {}
        pairs = metadata.items() if isinstance(metadata, Mapping) else metadata
        for key, value in pairs:
            if isinstance(value, bytes):
                continue  # binary (-bin) headers carry nothing we check
            headers[key.lower()] = value
        auth = headers.get(AUTHORIZATION_HEADER)
        if not auth:
            raise BrokerError(UNAUTHORIZED, "no authorization header: configure credentials")
        fields = _parse_authorization(auth)
        ak = fields.get("credential", "")
        # The Java client sends Credential=<ak>/<scope...>; only the key is ours.
        ak = ak.split("/", 1)[0]
        if not ak:
            raise BrokerError(UNAUTHORIZED, "no access key in the authorization header")
        signed = [h.strip().lower() for h in fields.get("signedheaders", "").split(";")]
        if DATE_TIME_HEADER not in signed:
            raise BrokerError(UNAUTHORIZED, f"the signature must cover {DATE_TIME_HEADER}")
        date_time = headers.get(DATE_TIME_HEADER, "")
        # Everything a caller can learn without a valid key is checked before the key is
        # looked up, and an unknown key fails exactly as a wrong secret does (same code, same
        # words, an HMAC computed either way): the answer must not tell which keys exist.
        self._check_fresh(date_time, time.time() if now is None else now)
        account = self.accounts.get(ak)
        expected = sign(account.secret_key if account else _NO_SECRET, date_time)
        signature_ok = hmac.compare_digest(fields.get("signature", "").lower(), expected)
        if account is None or not signature_ok:
            raise BrokerError(UNAUTHORIZED, f"access key {ak[:64]!r} and signature do not "
                              "match an account")
        return account

    def _check_fresh(self, date_time: str, now: float) -> None:
        try:
            parsed = time.strptime(date_time, _DATE_FORMAT)
        except ValueError:
            raise BrokerError(
                UNAUTHORIZED, f"{DATE_TIME_HEADER} {date_time!r} is not yyyyMMddTHHmmssZ"
            ) from None
        as_utc = calendar.timegm(parsed)
        as_local = time.mktime(parsed)  # the Python client's local time with a Z suffix
        if min(abs(as_utc - now), abs(as_local - now)) > self.window_sec:
            raise BrokerError(
                UNAUTHORIZED, f"{DATE_TIME_HEADER} {date_time} is more than "
                f"{self.window_sec} s from the broker's clock (aclSignatureWindowSec)",
            )

    # -- authorization --------------------------------------------------------------------------

    def permit(self, account: Account, resource: Resource, action: Action) -> None:
        """BrokerError(FORBIDDEN) unless ``account`` may do ``action`` on ``resource``."""
        if account.admin:
            return
        if action is Action.ADMIN or resource.kind is ResourceKind.CLUSTER:
            allowed = False
        else:
            need = Perm.PUB if action is Action.PUB else Perm.SUB
            allowed = need in account.perm(resource)
        if not allowed:
            raise BrokerError(
                FORBIDDEN, f"access key {account.access_key!r} has no {action} permission "
                f"on {resource.kind} {resource.name!r}",
            )

    def authorize(self, metadata: Mapping[str, str] | Iterable[tuple[str, str | bytes]],
                  resource: str, action: str) -> Account:
        """The broker's entry point (``Broker._authorize``): authenticate, then check.

        ``resource`` is ``"Topic:<name>"``, ``"Group:<name>"`` or ``"Cluster"``; ``action``
        one of Pub, Sub, Get, Create, Update, Delete, List. ``Get`` is read-only metadata:
        on a topic (route lookup) it needs PUB or SUB, on a group SUB, on the cluster
        (heartbeat, telemetry) only a valid signature. Create/Update/Delete/List need admin.
        """
        account = self.authenticate(metadata)
        self.check(account, resource, action)
        return account

    def check(self, account: Account, resource: str, action: str) -> None:
        """``authorize`` for an account already authenticated (the remoting adapter verifies
        RocketMQ 4's request signatures itself, then checks here)."""
        kind, _, name = resource.partition(":")
        kind = kind.lower()
        if kind not in ("topic", "group", "cluster"):
            raise BrokerError(FORBIDDEN, f"unknown resource {resource!r}")
        res = Resource(ResourceKind(kind), name)
        verb = action.lower()
        if verb == "pub":
            self.permit(account, res, Action.PUB)
        elif verb == "sub":
            self.permit(account, res, Action.SUB)
        elif verb == "get":
            if res.kind is ResourceKind.TOPIC and not account.admin:
                if not account.perm(res) & Perm.ANY:
                    raise BrokerError(FORBIDDEN, f"access key {account.access_key!r} has no "
                                      f"permission on topic {name!r}")
            elif res.kind is ResourceKind.GROUP:
                self.permit(account, res, Action.SUB)
        else:
            self.permit(account, res, Action.ADMIN)


def _read_acl_file(path: Path) -> Any:
    """``aclFile`` as a document: RocketMQ's ``plain_acl.yml`` (YAML) or the same fields as
    JSON. RocketMQ's IP white lists (``globalWhiteRemoteAddresses``, ``whiteRemoteAddress``)
    let matching addresses in without a signature; StrataMQ signs every request, so they are
    ignored, which only ever refuses more."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"aclFile {path}: {exc}") from None
    if path.suffix.lower() in (".yml", ".yaml"):
        import yaml

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"aclFile {path}: not valid YAML: {exc}") from None
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"aclFile {path}: {exc}") from None
    if isinstance(doc, dict):
        listed = [k for k in ("globalWhiteRemoteAddresses",) if doc.get(k)] + [
            "whiteRemoteAddress" for a in doc.get("accounts") or []
            if isinstance(a, dict) and a.get("whiteRemoteAddress")][:1]
        if listed:
            log.warning("aclFile %s: %s ignored (every request must be signed)", path,
                        " and ".join(listed))
    return doc


def _parse_authorization(value: str) -> dict[str, str]:
    algorithm, fields = parse_authorization(value)
    if algorithm != ALGORITHM:
        raise BrokerError(UNAUTHORIZED, f"unsupported signature algorithm {algorithm!r}")
    return fields
