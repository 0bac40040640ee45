"""``enable_transport``: Monarch's choice of wire transport, which here is always the broker.

Monarch 0.7 scripts call ``enable_transport("tcp")`` (or give an address,
``"tcp://1.2.3.4:26600@tcp://0.0.0.0:26600"``) before attaching to workers on
other machines. Here every message travels through the NATS broker, so there
is no client transport to choose: the call is Monarch's other spelling of the
``default_transport`` configuration key, checked and kept like the other keys
that have no effect here (``monarch.configure``, docs/configuration.md), so
such a script runs unchanged. What it would mean in Monarch is done otherwise:
workers on other machines need a broker they reach (``MONARCH_NATS_URL``), and
a worker address given to ``attach_to_workers`` is dialled as before.

TLS transports (``"tls"``, ``"metatls"``, ...) are refused, not ignored: a
script asking for encryption must not run without it. TLS is the broker's
setting here (``MONARCH_NATS_TLS_*``).
"""

from __future__ import annotations

import threading
from typing import Any

from monarch.actors.compat import ChannelTransport
from monarch.config.layer import configure
from monarch.core.process_runtime import current_runtime_or_none

# Monarch's string shortcuts for its transports.
_SHORTCUTS = {
    "tcp": ChannelTransport.TcpWithHostname,
    "ipc": ChannelTransport.Unix,
    "metatls": ChannelTransport.MetaTlsWithIpV6,
    "metatls-hostname": ChannelTransport.MetaTlsWithHostname,
    "tls": ChannelTransport.Tls,
}
_enabled: Any = None  # what enable_transport was given in this process
_lock = threading.Lock()
_ENCRYPTED = {
    ChannelTransport.Tls,
    ChannelTransport.MetaTlsWithHostname,
    ChannelTransport.MetaTlsWithIpV6,
}


def enable_transport(transport: ChannelTransport | str) -> None:
    """Accept Monarch's transport choice; nothing changes on the wire (every message uses the broker).

    Takes what Monarch takes: a ``ChannelTransport``, one of ``"tcp"`` and
    ``"ipc"``, or an address (``tcp://host:port``, ``tcp://public:port@tcp://bind:port``,
    ``ipc://path``); anything else is a ``ValueError``. A TLS transport raises
    ``NotImplementedError`` naming the broker's TLS settings. As in Monarch, a
    second, different transport, or any but the default once the runtime has
    started, raises ``RuntimeError``; the same one again is a no-op.
    """
    value: Any = _SHORTCUTS.get(transport, transport) if isinstance(transport, str) else transport
    if value in _ENCRYPTED or (isinstance(value, str) and value.startswith("metatls://")):
        raise NotImplementedError(
            f"enable_transport({transport!r}) is not available in monarch over NATS: messages "
            "travel through the broker, so encrypt them there (a tls:// broker URL and "
            "MONARCH_NATS_TLS_CA/_CERT/_KEY; docs/security.md)"
        )
    if isinstance(value, str):
        # Monarch's address forms: one address, or "dial@bind".
        for part in value.split("@"):
            scheme, sep, rest = part.partition("://")
            if not sep or scheme not in ("tcp", "ipc", "unix") or not rest:
                raise ValueError(
                    f"enable_transport({transport!r}): not a transport (a ChannelTransport, "
                    "'tcp' or 'ipc') nor an address (tcp://host:port, ipc://path)"
                )
    global _enabled
    with _lock:  # Monarch's rules: one transport per process, chosen before the first use
        if current_runtime_or_none() is not None and value != (_enabled or ChannelTransport.Unix):
            raise RuntimeError(
                "`enable_transport()` must be called before any other calls in the monarch API. "
                "If it isn't called, we will implicitly call "
                "`monarch.enable_transport(ChannelTransport.Unix)` on the first monarch call."
            )
        if _enabled is not None and _enabled != value:
            raise RuntimeError(
                "Only one transport type may be enabled at one time. Currently enabled "
                f"transport type is `{_enabled}`. Attempted to enable transport type `{value}`."
            )
        _enabled = value
    configure(default_transport=value)
