"""A throwaway NATS operator, accounts and users, for testing ``.creds`` logins.

In operator mode nats-server trusts an operator's key; the operator signs
account JWTs, an account signs user JWTs, and a client proves it holds the
user's key by signing the server's nonce. nats-py reads the user JWT and seed
from a ``.creds`` file (``MONARCH_NATS_CREDS``). Real deployments make these
with the ``nsc`` tool; here they are made with ``nkeys`` so the test needs no
tool beyond the server itself.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import nkeys


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class Identity:
    """One nkey pair (operator, account or user) and the JWT that vouches for it."""

    seed: bytes
    public: str
    jwt: str = ""

    @classmethod
    def new(cls, prefix: int) -> Identity:
        seed = nkeys.encode_seed(os.urandom(32), prefix)
        return cls(seed=seed, public=nkeys.from_seed(bytearray(seed)).public_key.decode())

    def sign(self, subject: Identity, name: str, nats: dict) -> str:
        """A JWT for ``subject`` signed by this identity's key."""
        header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
        claims = {
            "jti": uuid.uuid4().hex.upper(),
            "iat": int(time.time()),
            "iss": self.public,
            "name": name,
            "sub": subject.public,
            "nats": nats,
        }
        body = _b64(json.dumps(claims).encode())
        signature = nkeys.from_seed(bytearray(self.seed)).sign(f"{header}.{body}".encode())
        return f"{header}.{body}.{_b64(signature)}"


_UNLIMITED = {"subs": -1, "data": -1, "payload": -1}
_ACCOUNT_LIMITS = {
    **_UNLIMITED,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
    "mem_storage": -1,
    "disk_storage": -1,
    "streams": -1,
    "consumer": -1,
}


class Operator:
    """An operator with a system account; makes accounts, users and the server config."""

    def __init__(self) -> None:
        self.key = Identity.new(nkeys.PREFIX_BYTE_OPERATOR)
        self.accounts: list[Identity] = []
        self.system = self.account("SYS", jetstream=False)
        self.key.jwt = self.key.sign(
            self.key,
            "test-operator",
            {"type": "operator", "version": 2, "system_account": self.system.public},
        )

    def account(self, name: str, *, jetstream: bool = True) -> Identity:
        acct = Identity.new(nkeys.PREFIX_BYTE_ACCOUNT)
        limits = dict(_ACCOUNT_LIMITS)
        if not jetstream:
            limits.update(mem_storage=0, disk_storage=0, streams=0, consumer=0)
        acct.jwt = self.key.sign(acct, name, {"limits": limits, "type": "account", "version": 2})
        self.accounts.append(acct)
        return acct

    @staticmethod
    def user(account: Identity, name: str) -> Identity:
        user = Identity.new(nkeys.PREFIX_BYTE_USER)
        user.jwt = account.sign(
            user, name, {"pub": {}, "sub": {}, **_UNLIMITED, "type": "user", "version": 2}
        )
        return user

    def server_config(self, path: Path) -> Path:
        """A nats-server config trusting this operator, with every account preloaded."""
        preload = "\n".join(f'  {a.public}: "{a.jwt}"' for a in self.accounts)
        path.write_text(
            f'operator: "{self.key.jwt}"\n'
            f"system_account: {self.system.public}\n"
            "resolver: MEMORY\n"
            f"resolver_preload: {{\n{preload}\n}}\n"
        )
        return path


def write_creds(user: Identity, path: Path) -> Path:
    """A ``.creds`` file in the layout ``nsc`` writes and nats-py reads."""
    path.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{user.jwt}\n"
        "------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user.seed.decode()}\n"
        "------END USER NKEY SEED------\n"
    )
    path.chmod(0o600)
    return path
