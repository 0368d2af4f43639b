"""RocketMQ 4's request signatures on remoting (the client's ``AclClientRPCHook``), checked
against the same accounts and permissions as the gRPC side (``broker.acl.AclChecker``).

A signed request carries ``AccessKey`` (and optionally ``SecurityToken``) among its ext fields
and ``Signature`` = base64(HmacSHA1(secretKey, the values of every other ext field in key
order, concatenated, then the body)). Every request is verified before its handler runs; a
missing, unknown or wrong signature, like a missing permission, is answered ``NO_PERMISSION``
(16), as RocketMQ 5's authentication and authorization pipelines answer. An unknown key fails
exactly as a wrong secret does, so the answer does not tell which keys exist. RocketMQ 4's
signature covers no time stamp, so unlike the gRPC signature it has no freshness window.

Thread-safety: immutable after construction.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from stratamq.broker.acl import Account, AclChecker
from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import ResponseCode
from stratamq.remoting.errors import RemotingError

__all__ = ["VERIFIED_KEY", "RemotingAcl", "signature"]

ACCESS_KEY, SIGNATURE = "AccessKey", "Signature"  # SessionCredentials
# The key under which the adapter hands the verified access key to the shared lookups (in
# a metadata map it builds itself, never from the client's fields).
VERIFIED_KEY = "x-stratamq-remoting-access-key"
_NO_SECRET = "\0 no account has this secret \0"


def signature(secret_key: str, ext_fields: Mapping[str, str], body: bytes) -> str:
    """``AclUtils.calSignature(combineRequestContent(...), secretKey)``."""
    content = "".join(v for k, v in sorted(ext_fields.items()) if k != SIGNATURE).encode()
    digest = hmac.new(secret_key.encode(), content + body, hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


class RemotingAcl:
    """Verifies requests; then, as a ``Lookup``'s ``acl``, checks permissions."""

    def __init__(self, checker: AclChecker) -> None:
        self.checker = checker

    def verify(self, request: RemotingCommand) -> str:
        """The verified access key; RemotingError(NO_PERMISSION) otherwise."""
        fields = request.ext_fields
        ak = fields.get(ACCESS_KEY, "")
        if not ak or SIGNATURE not in fields:
            raise RemotingError(ResponseCode.NO_PERMISSION,
                                "the request is not signed: configure the client's "
                                "AccessKey and SecretKey (AclClientRPCHook)")
        account = self.checker.accounts.get(ak)
        expected = signature(account.secret_key if account else _NO_SECRET, fields,
                             request.body)
        if not hmac.compare_digest(fields[SIGNATURE], expected) or account is None:
            raise RemotingError(ResponseCode.NO_PERMISSION,
                                f"access key {ak[:64]!r} and signature do not match an "
                                "account")
        return ak

    def authorize(self, metadata: Mapping[str, str], resource: str, action: str) -> Account:
        account = self.checker.accounts.get(metadata.get(VERIFIED_KEY, ""))
        if account is None:  # (the adapter verified first: cannot happen)
            raise RemotingError(ResponseCode.NO_PERMISSION, "the request is not signed")
        self.checker.check(account, resource, action)
        return account
