"""Monarch's configuration API (``monarch.configure``, ``monarch.configured``, ...).

This module only re-exports; the layer lives in :mod:`monarch.config.layer`
and the table of Monarch 0.7's keys (which map onto our ``MONARCH_*``
settings, which are accepted without effect) in :mod:`monarch.config.keys`;
``parametrize_config`` (pytest helpers) in :mod:`monarch.config.parametrize`.
"""

from monarch.config.keys import Encoding
from monarch.config.layer import (
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
)
from monarch.config.parametrize import parametrize_config, parametrize_config_pointwise

__all__ = [
    "Encoding",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
]
