"""The runtime configuration layer: what ``monarch.configure(...)`` set in this process.

Layers, lowest first: defaults, the ``MONARCH_*`` environment, this layer.
The layer is applied *as* ``MONARCH_*`` environment variables of this
process (the values they had before are kept and put back by
:func:`clear_runtime_config`). That is deliberate: the environment is how
every process of a job already learns the job's settings (procs copy the
client's environment; host agents forward its ``MONARCH_*`` variables), so a
value configured before the runtime starts reaches the client runtime and
every proc it starts afterwards, with no second channel to keep in step.

The runtime reads its settings once, when it starts, and its procs share
them. So once it has started, a change to one of our settings is refused
(RuntimeError) rather than half applied; a restore (leaving
:func:`configured`, :func:`clear_runtime_config`) keeps such a setting as the
running runtime has it, with a warning, until ``shutdown_context()``.
Monarch keys that mean nothing here (:data:`keys.INERT`) may change at any
time, and so may ``mesh_attach_config_timeout``, read by each attach.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from monarch.config import keys
from monarch.core.process_runtime import current_runtime_or_none
from monarch.settings import ENV_PREFIX, Settings, settings

_lock = threading.RLock()
_layer: dict[str, Any] = {}  # key as the user wrote it -> checked value, in order set
_saved_env: dict[str, str | None] = {}  # MONARCH_* variable -> its value before we set it
_SECRETS = ("nats_token", "nats_password", "nats_job_key")
# Settings the runtime does not fix when it starts: each use reads the current
# value (attach_to_workers reads attach_timeout when called), so they may change
# while it runs.
_READ_WHEN_USED = frozenset({"attach_timeout", "rdma_allow_tcp_fallback"})


def configure(**kwargs: Any) -> None:
    """Set configuration keys for this process (and the procs it starts afterwards).

    Keys are our settings by name (``heartbeat_timeout=5.0``, ``namespace="jobA"``,
    the ``MONARCH_*`` variables without prefix, lower case) or Monarch 0.7's
    keys: those that mean something here map onto our settings
    (``mesh_proc_spawn_max_idle="90s"`` sets ``spawn_timeout``), the others
    are accepted and reported but have no effect. All keys are checked before
    any is applied: an unknown key raises ValueError naming it, a value of
    the wrong type TypeError, an out-of-range value ValueError. After this
    process's runtime started, changing one of our settings raises
    RuntimeError: the runtime and its procs keep the settings they started with.
    """
    with _lock:
        checked = _check(kwargs)
        new_layer = {**_layer, **checked}
        _refuse_changes_while_running(_effective(new_layer))
        _apply(new_layer)


def get_runtime_config() -> dict[str, Any]:
    """The keys set by :func:`configure` (and not cleared), with their values.

    Passing it back to :func:`configure` after :func:`clear_runtime_config`
    restores the layer: this is how :func:`configured` restores.
    """
    with _lock:
        return dict(_layer)


def get_global_config() -> dict[str, Any]:
    """Every key with the value in effect: defaults, environment and this layer merged.

    Our settings appear under their own names (credentials masked as
    ``'***'``), Monarch's keys under theirs (mapped ones translated from our
    setting, e.g. ``spawn_timeout=90.0`` as ``mesh_proc_spawn_max_idle='1m 30s'``).
    Mutating the dict changes nothing.
    """
    with _lock:
        # A running runtime's settings are the ones in effect; before it starts,
        # the environment as it is now (what the runtime will read when it starts).
        now = Settings.from_env()
        current = _running_settings() or now
        current = current.model_copy(update={n: getattr(now, n) for n in _READ_WHEN_USED})
        out: dict[str, Any] = {}
        for key in keys.INERT:
            out[key] = _layer[key] if key in _layer else keys.inert_default(key)
        for key, mapped in keys.MAPPED.items():
            out[key] = mapped.to_monarch(getattr(current, mapped.setting))
        for name in Settings.model_fields:
            value = getattr(current, name)
            out[name] = "***" if name in _SECRETS and value else value
        if current.nats_url and "@" in current.nats_url:
            out["nats_url"] = ",".join(_mask_userinfo(u) for u in current.nats_url.split(","))
        return out


def clear_runtime_config() -> None:
    """Remove every key set by :func:`configure`; the environment's values apply again.

    While a runtime runs, our settings it started with stay (with a warning)
    until ``shutdown_context()``; Monarch's inert keys are cleared at once.
    """
    with _lock:
        _restore({})


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[dict[str, Any]]:
    """``configure(**overrides)`` for the ``with`` block; yields :func:`get_global_config`.

    On exit the layer is put back as it was, except our settings that a
    runtime started inside the block uses (see :func:`clear_runtime_config`).
    Like Monarch's, this changes the process's configuration, seen by every
    thread: it is meant for tests and scripts, not for concurrent use.
    """
    previous = get_runtime_config()
    try:
        configure(**overrides)
        yield get_global_config()
    finally:
        with _lock:
            _restore(previous)


# -- internals ------------------------------------------------------------------


def _check(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keys' values, checked and normalised; raises naming every unknown key."""
    unknown = sorted(k for k in kwargs if not _known(k))
    if unknown:
        names = ", ".join(f"`{k}`" for k in unknown)
        raise ValueError(
            f"invalid configuration key: {names} (neither a Monarch 0.7 key nor one of our "
            f"settings: {', '.join(Settings.model_fields)})"
        )
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in keys.MAPPED:
            keys.MAPPED[key].to_ours(key, value)  # raises naming the key
            out[key] = value
        elif key in keys.INERT:
            out[key] = keys.check_inert(key, value)
        else:
            out[key] = value
    validated = _validate(_effective({**_layer, **out}), names=out)
    for key in out:
        if key in Settings.model_fields:
            out[key] = getattr(validated, key)  # "5" -> 5.0, as the runtime will read it
    return out


def _known(key: str) -> bool:
    return key in Settings.model_fields or key in keys.MAPPED or key in keys.INERT


def _effective(layer: dict[str, Any]) -> dict[str, Any]:
    """Our settings the layer sets (later keys win), as our settings' values."""
    out: dict[str, Any] = {}
    for key, value in layer.items():
        if key in keys.MAPPED:
            mapped = keys.MAPPED[key]
            out[mapped.setting] = mapped.to_ours(key, value)
        elif key in Settings.model_fields:
            out[key] = value
    return out


def _validate(overrides: dict[str, Any], names: dict[str, Any]) -> Settings:
    """Our settings with ``overrides`` over the (original) environment; errors name the key."""
    base = _original_env()
    try:
        return Settings(**{**_env_values(base), **overrides})
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "?"
        key = next((k for k in names if _setting_of(k) == name), name)
        kind = TypeError if err["type"].endswith(("_type", "_parsing")) else ValueError
        value = "***" if name in _SECRETS else repr(names.get(key, overrides.get(name)))
        raise kind(
            f"invalid value {value} for configuration key "
            f"`{key}` ({ENV_PREFIX}{name.upper()}): {err['msg']}"
        ) from None


def _setting_of(key: str) -> str | None:
    if key in keys.MAPPED:
        return keys.MAPPED[key].setting
    return key if key in Settings.model_fields else None


def _original_env() -> dict[str, str]:
    """The environment as it was before this layer touched it."""
    env = dict(os.environ)
    for var, value in _saved_env.items():
        if value is None:
            env.pop(var, None)
        else:
            env[var] = value
    return env


def _env_values(env: dict[str, str]) -> dict[str, str]:
    values = {}
    for name in Settings.model_fields:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw:
            values[name] = raw
    return values


def _running_settings() -> Settings | None:
    """The settings this process's runtime started with, if one runs."""
    rt = current_runtime_or_none()  # asking starts nothing
    return rt.settings if rt is not None else None


def _refuse_changes_while_running(overrides: dict[str, Any]) -> None:
    running = _running_settings()
    if running is None:
        return
    wanted = _validate(overrides, names={})
    changed = [
        n
        for n in overrides
        if n not in _READ_WHEN_USED and getattr(wanted, n) != getattr(running, n)
    ]
    if changed:
        raise RuntimeError(
            f"monarch.configure: {', '.join(changed)} cannot change while this process's "
            "runtime runs (it and its procs read their settings when they start); configure "
            "before the first mesh is created, or after monarch.actor.shutdown_context()"
        )


def _restore(layer: dict[str, Any]) -> None:
    """Make ``layer`` the layer, keeping settings a running runtime depends on."""
    running = _running_settings()
    if running is not None:
        wanted = _validate(_effective(layer), names={})
        kept = {
            n: getattr(running, n)
            for n in Settings.model_fields
            if n not in _READ_WHEN_USED
            and getattr(wanted, n) != getattr(running, n)
            and n in _effective(_layer)
        }
        if kept:
            warnings.warn(
                f"monarch.config: {', '.join(kept)} kept as the running runtime has them "
                "until monarch.actor.shutdown_context()",
                RuntimeWarning,
                stacklevel=3,
            )
            layer = {**layer, **kept}
    _apply(layer)


def _apply(layer: dict[str, Any]) -> None:
    """Make ``layer`` the layer and the environment match it."""
    effective = _effective(layer)
    for name in Settings.model_fields:
        var = ENV_PREFIX + name.upper()
        if name in effective:
            if var not in _saved_env:
                _saved_env[var] = os.environ.get(var)
            value = effective[name]
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = _env_text(value)
        elif var in _saved_env:
            original = _saved_env.pop(var)
            if original is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = original
    _layer.clear()
    _layer.update(layer)
    settings.cache_clear()


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _mask_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
