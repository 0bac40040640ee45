"""Monarch 0.7's configuration keys, and what each one means here.

Monarch's ``configure(**keys)`` takes the settings of its Rust runtime
(hyperactor). A few mean the same thing as one of our ``MONARCH_*``
settings and are translated onto it (:data:`MAPPED`); the rest describe
parts that do not exist over NATS (channel transports, frame codecs, the mesh
admin server, ibverbs tuning, telemetry back ends) and are accepted,
type-checked and reported back so that scripts written for Monarch run
unchanged, but change nothing (:data:`INERT`). A key in neither table, and
not one of our own settings, is an error.

Durations are humantime strings as in Monarch (``"30s"``, ``"500ms"``,
``"1m 30s"``); our settings hold seconds.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class Encoding(enum.Enum):
    """Monarch's message encodings; ``Json`` selects our JSON wire, the others msgpack."""

    Bincode = "bincode"
    Json = "json"
    Multipart = "multipart"


# -- humantime ------------------------------------------------------------------

_UNITS = {
    "ns": 1e-9,
    "nsec": 1e-9,
    "us": 1e-6,
    "usec": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "msec": 1e-3,
    "millis": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
_PART = re.compile(r"\s*(\d+)\s*([a-zµ]+)")


def parse_duration(key: str, text: Any) -> float:
    """Seconds in a humantime string; TypeError naming ``key`` if it is not one (as Monarch)."""
    if not isinstance(text, str):
        raise TypeError(
            f"invalid value {text!r} for configuration key `{key}`: "
            f"a duration is a string such as '30s', '500ms' or '1m 30s'"
        )
    pos, total = 0, 0.0
    stripped = text.strip()
    while pos < len(stripped):
        m = _PART.match(stripped, pos)
        if m is None or m.group(2) not in _UNITS:
            raise TypeError(  # as Monarch does, so scripts that catch it keep working
                f"invalid value {text!r} for configuration key `{key}`: "
                f"not a duration such as '30s', '500ms' or '1m 30s'"
            )
        total += int(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not stripped:
        raise TypeError(f"invalid value {text!r} for configuration key `{key}`: empty duration")
    return total


def format_duration(seconds: float) -> str:
    """``seconds`` as humantime writes it: ``90.0`` -> ``'1m 30s'``, ``0.5`` -> ``'500ms'``."""
    ms = round(seconds * 1000)
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        n, ms = divmod(ms, size)
        if n:
            parts.append(f"{n}{unit}")
    if ms or not parts:
        parts.append(f"{ms}ms")
    return " ".join(parts)


# -- keys that map onto our settings ----------------------------------------------


@dataclass(frozen=True)
class Mapped:
    """A Monarch key that sets one of our settings, with the two-way translation."""

    setting: str
    to_ours: Callable[[str, Any], Any]  # (key, Monarch value) -> our setting's value
    to_monarch: Callable[[Any], Any]  # our setting's value -> Monarch's form


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"invalid value {value!r} for configuration key `{key}`: not a bool")
    return value


def _encoding(key: str, value: Any) -> str:
    if not isinstance(value, Encoding):
        raise TypeError(
            f"invalid value {value!r} for configuration key `{key}`: "
            "use monarch.config.Encoding.Json, .Bincode or .Multipart"
        )
    return "json" if value is Encoding.Json else "msgpack"


def _seconds(setting: str) -> Mapped:
    return Mapped(setting, parse_duration, format_duration)


MAPPED: dict[str, Mapped] = {
    # Procs coming up: Monarch splits it into host and proc phases; we have one deadline.
    "host_spawn_ready_timeout": _seconds("spawn_timeout"),
    "mesh_proc_spawn_max_idle": _seconds("spawn_timeout"),
    # A graceful stop of actors / procs before they are killed.
    "stop_actor_timeout": _seconds("stop_timeout"),
    "mesh_terminate_timeout": _seconds("stop_timeout"),
    # How long a worker given by address has to take the client's hello (its config).
    "mesh_attach_config_timeout": _seconds("attach_timeout"),
    # The kernel's parent-death signal on spawned procs.
    "mesh_bootstrap_enable_pdeathsig": Mapped("die_with_parent", _bool, lambda v: v),
    # Body encoding: Json is our JSON wire; Bincode and Multipart are msgpack here.
    "default_encoding": Mapped(
        "wire", _encoding, lambda v: Encoding.Json if v == "json" else Encoding.Multipart
    ),
}


# -- keys accepted for compatibility, with Monarch 0.7's defaults -----------------

DEFAULT_TRANSPORT = "default_transport"  # its default is monarch.actor.ChannelTransport.Unix

INERT: dict[str, Any] = {
    "actor_spawn_max_idle": "30s",
    "channel_net_rx_buffer_full_check_interval": "5s",
    "channel_reconnect_timeout": "1m",
    "channel_tcp_congestion": "",
    "channel_tcp_keepalive_idle": "1m",
    "cleanup_timeout": "3s",
    "codec_max_frame_length": 10737418240,
    DEFAULT_TRANSPORT: None,
    "enable_dest_actor_reordering_buffer": True,
    "enable_file_capture": False,
    "enable_log_forwarding": False,
    "enable_otel_metrics": True,
    "enable_otel_tracing": True,
    "enable_recorder_tracing": True,
    "enable_sqlite_tracing": False,
    "enable_unawaited_python_task_traceback": False,
    "file_log_level": "",
    "force_file_log": False,
    "forwarder_flush_timeout": "5s",
    "get_actor_state_max_idle": "30s",
    "get_proc_state_max_idle": "1m",
    "max_cast_dimension_size": 16,
    "max_cast_fanout": 16,
    "mesh_admin_addr": "[::]:1729",
    "mesh_admin_config_dump_bridge_timeout": "5s",
    "mesh_admin_max_concurrent_resolves": 2,
    "mesh_admin_pyspy_bridge_timeout": "13s",
    "mesh_admin_pyspy_client_timeout": "20s",
    "mesh_admin_pyspy_max_profile_duration": "5m",
    "mesh_admin_pyspy_timeout": "10s",
    "mesh_admin_query_child_timeout": "100ms",
    "mesh_admin_resolve_actor_timeout": "200ms",
    "mesh_admin_single_host_timeout": "3s",
    "mesh_admin_tree_timeout": "10s",
    "mesh_orphan_timeout": "1m",
    "mesh_terminate_concurrency": 16,
    "message_ack_every_n_messages": 1000,
    "message_ack_time_interval": "500ms",
    "message_delivery_timeout": "30s",
    "message_latency_sampling_rate": 0.01,
    "message_ttl_default": 64,
    "monarch_log_suffix": "",
    "otel_metric_export_interval": "1s",
    "pending_actor_delivery_timeout": "30s",
    "prefix_with_rank": True,
    "proc_launcher_kind": "",
    "proc_stop_max_idle": "30s",
    "process_exit_timeout": "10s",
    "process_memory_metric_interval": "5m",
    "pyspy_bin": "",
    "rdma_cq_poller_per_device": True,
    "rdma_disable_ibverbs": False,
    "rdma_host_odp": False,
    "rdma_ibverbs_target": "",
    "rdma_max_chunk_size_mb": 64,
    "rdma_max_nics_per_buffer": None,
    "rdma_min_stripe_size_kb": 512,
    "rdma_peer_device_affinity": "",
    "rdma_qp_init_timeout": "30s",
    "rdma_qps_per_cq": 64,
    "rdma_qps_per_peer": 4,
    "rdma_runtime_worker_threads": 4,
    "rdma_tcp_fallback_parallelism": 1,
    "read_log_buffer": 100,
    "remote_alloc_allowed_port_range": None,
    "remote_alloc_bind_to_inaddr_any": False,
    "remote_alloc_bootstrap_addr": "",
    "scuba_log_enter_exit": False,
    "sequencer_max_locked_keys": 128,
    "server_heartbeat_interval": "1s",
    "small_write_threshold": 256,
    "split_max_buffer_age": "50ms",
    "split_max_buffer_size": 5,
    "stop_grace_period": "10s",
    "supervision_watchdog_timeout": "2m",
    "tail_log_lines": 0,
    "terminated_snapshot_retention": 100,
    "tokio_worker_threads": None,
    "use_direct_spawn": False,
}

# What Monarch's default_transport takes besides a ChannelTransport: these names,
# or an address with one of them as its scheme ("tcp://127.0.0.1:8080").
_TRANSPORT_SCHEMES = {"tcp", "unix", "ipc", "metatls", "local"}

# Keys whose default is None take an int or None, except these.
_NONE_DEFAULT_TYPES: dict[str, tuple[type, ...]] = {"remote_alloc_allowed_port_range": (slice,)}


def inert_default(key: str) -> Any:
    if key == DEFAULT_TRANSPORT:
        # Deferred: monarch.actors is only needed when a script asks for this key.
        from monarch.actors.compat import ChannelTransport

        return ChannelTransport.Unix
    return INERT[key]


def check_inert(key: str, value: Any) -> Any:
    """``value`` for an inert key, checked against the type of Monarch's default."""
    default = INERT[key]
    if key == DEFAULT_TRANSPORT:
        # Deferred: monarch.actors is only needed when a script asks for this key.
        from monarch.actors.compat import ChannelTransport

        if isinstance(value, ChannelTransport):
            return value
        if not isinstance(value, str):
            raise TypeError(
                f"invalid value {value!r} for configuration key `{key}`: "
                "use a ChannelTransport or a transport name"
            )
        scheme, sep, _ = value.partition("://")
        names = {t.value for t in ChannelTransport} | _TRANSPORT_SCHEMES
        if (scheme not in _TRANSPORT_SCHEMES) if sep else (value not in names):
            raise ValueError(
                f"invalid value {value!r} for configuration key `{key}`: not a transport "
                f"name ({', '.join(sorted(names))}) or address (tcp://host:port, unix://path)"
            )
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, str):
        if _looks_like_duration(default):
            # Normalised as Monarch reports it: "5sec" -> "5s", "90s" -> "1m 30s".
            return format_duration(parse_duration(key, value))
        ok = isinstance(value, str)
    else:  # default None
        types = _NONE_DEFAULT_TYPES.get(key, (int,))
        ok = value is None or isinstance(value, types)
    if not ok:
        raise TypeError(
            f"invalid value {value!r} for configuration key `{key}`: "
            f"expected {type(default).__name__ if default is not None else 'int or None'}"
        )
    return value


def _looks_like_duration(default: str) -> bool:
    return bool(default) and _PART.match(default) is not None
