"""Subject names, exactly as the table in docs/design.md ("Subjects") gives them.

Every subject starts with ``mon.<namespace>`` so that several jobs can share a
broker and NATS permissions can fence them. Tokens are readable names plus
short unique ids, so ``nats sub 'mon.>'`` tells a person what is flowing.
"""

from __future__ import annotations

import re
import secrets

WILDCARD = "_"
"""The token that stands for "every coordinate along this dimension"."""

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def new_uid() -> str:
    """A short unique id for a proc, host, mesh or port owner (8 hex digits)."""
    return secrets.token_hex(4)


def check_token(value: str, what: str) -> str:
    """Reject names that would break a subject (dots, spaces, wildcards)."""
    if not isinstance(value, str) or not _TOKEN.fullmatch(value) or value == WILDCARD:
        raise ValueError(
            f"{what} {value!r} cannot be used in a NATS subject: "
            "use letters, digits, '-' and '_' only (and not a lone '_')"
        )
    return value


def root(namespace: str) -> str:
    return f"mon.{namespace}"


def actor(namespace: str, mesh_name: str, mesh_uid: str, tokens: list[str]) -> str:
    """Messages to the members of an actor mesh; each token a coordinate or ``_``."""
    suffix = "".join("." + t for t in tokens)
    return f"mon.{namespace}.act.{mesh_name}.{mesh_uid}{suffix}"


def actor_mesh_wildcard(namespace: str, mesh_name: str, mesh_uid: str) -> str:
    return f"mon.{namespace}.act.{mesh_name}.{mesh_uid}.>"


def port(namespace: str, proc_uid: str, port_id: int | str) -> str:
    """Replies and port messages to one port of one proc."""
    return f"mon.{namespace}.port.{proc_uid}.{port_id}"


def port_wildcard(namespace: str, proc_uid: str) -> str:
    """The one subscription each proc makes for all of its ports."""
    return f"mon.{namespace}.port.{proc_uid}.*"


def ctl_proc(namespace: str, proc_uid: str) -> str:
    return f"mon.{namespace}.ctl.proc.{proc_uid}"


def ctl_host(namespace: str, host_uid: str) -> str:
    return f"mon.{namespace}.ctl.host.{host_uid}"


def heartbeat(namespace: str, uid: str) -> str:
    return f"mon.{namespace}.hb.{uid}"


def supervision(namespace: str, owner_uid: str) -> str:
    return f"mon.{namespace}.sup.{owner_uid}"


def log(namespace: str, proc_uid: str) -> str:
    return f"mon.{namespace}.log.{proc_uid}"


def telemetry(namespace: str, proc_uid: str) -> str:
    """A process's batches of spans and metric points (``monarch query``)."""
    return f"mon.{namespace}.tel.{proc_uid}"


def telemetry_wildcard(namespace: str) -> str:
    return f"mon.{namespace}.tel.>"


def point_subscriptions(
    namespace: str, mesh_name: str, mesh_uid: str, coords: list[int]
) -> list[str]:
    """The 2^d subjects an actor at ``coords`` listens on.

    Each dimension is either the actor's own coordinate or ``_``, so a publish
    that fixes some dimensions and spans the rest is delivered by the server
    to exactly the actors it names, and each of them receives it once.
    """
    choices: list[list[str]] = [[]]
    for c in coords:
        choices = [prefix + [tok] for prefix in choices for tok in (str(c), WILDCARD)]
    return [actor(namespace, mesh_name, mesh_uid, toks) for toks in choices]


def ps_subject(namespace: str) -> str:
    """Every proc answers requests here with what it runs (``monarch ps``)."""
    return f"mon.{namespace}.ctl.ps"


def stats_subject(namespace: str) -> str:
    """Every process with actors answers requests here with what they are doing
    (``monarch top``; the answer's format: monarch.actors.hosting.stats)."""
    return f"mon.{namespace}.ctl.stats"


def stacks_subject(namespace: str, proc_uid: str) -> str:
    """A process answers requests here with the Python stack of each of its threads
    (``monarch stacks``; the answer's format: monarch.actors.hosting.stacks)."""
    return f"mon.{namespace}.ctl.stacks.{proc_uid}"
