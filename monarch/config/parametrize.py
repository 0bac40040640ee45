"""``parametrize_config`` / ``parametrize_config_pointwise``: run a pytest test under several configurations.

Each decorated test runs once per configuration, inside ``configured(...)``
with it, so the test body sees the values in :func:`get_global_config` and
the configuration is restored after each run. Sync and async tests both
work. pytest is imported when a decorator is made, not with this module.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Iterable
from typing import Any

from monarch.config.layer import configured

_PARAM = "_config_overrides"


def parametrize_config(**options: Iterable[Any]) -> Callable[[Callable[..., Any]], Any]:
    """Run the test under every combination (cartesian product) of the given values."""
    if not options:
        raise ValueError("parametrize_config needs at least one configuration key")
    keys = list(options)
    combos = list(itertools.product(*(list(options[k]) for k in keys)))
    return _parametrize(keys, combos)


def parametrize_config_pointwise(**options: Iterable[Any]) -> Callable[[Callable[..., Any]], Any]:
    """Run the test once per position: the i-th value of every key together (like ``zip``)."""
    if not options:
        raise ValueError("parametrize_config_pointwise needs at least one configuration key")
    keys = list(options)
    values = [list(options[k]) for k in keys]
    lengths = {k: len(v) for k, v in zip(keys, values, strict=True)}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"parametrize_config_pointwise needs equally many values, got {lengths}")
    return _parametrize(keys, list(zip(*values, strict=True)))


def _parametrize(keys: list[str], combos: list[tuple]) -> Callable[[Callable[..., Any]], Any]:
    import pytest  # only tests use this module; scripts importing monarch.config need no pytest

    configs = [dict(zip(keys, combo, strict=True)) for combo in combos]
    ids = ["-".join(f"{k}={v}" for k, v in config.items()) for config in configs]

    def decorate(fn: Callable[..., Any]) -> Any:
        sig = inspect.signature(fn)
        params = [inspect.Parameter(_PARAM, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        new_sig = sig.replace(parameters=[*params, *sig.parameters.values()])
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def wrapper(_config_overrides: dict, *args: Any, **kwargs: Any) -> Any:
                with configured(**_config_overrides):
                    return await fn(*args, **kwargs)
        else:

            @functools.wraps(fn)
            def wrapper(_config_overrides: dict, *args: Any, **kwargs: Any) -> Any:
                with configured(**_config_overrides):
                    return fn(*args, **kwargs)

        wrapper.__signature__ = new_sig  # type: ignore[attr-defined]
        return pytest.mark.parametrize(_PARAM, configs, ids=ids)(wrapper)

    return decorate
