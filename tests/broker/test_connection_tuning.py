"""The per-connection replacements of nats-py's reader and flusher steps stand aside cleanly.

``direct_read`` and ``write_through`` each touch nats-py internals; where a
connection lacks them, is not connected, or the setting turns them off, the
connection must stay exactly as nats-py made it, and a mistyped setting must
be refused by name.
"""

from __future__ import annotations

import types

import nats
import pytest
from nats.aio.client import Client

from monarch.broker.natspy_internals import direct_read, write_through
from monarch.settings import settings
from tests.helpers import run_in_own_loop

# (module, its setting, the nats-py attribute it replaces on a connection)
TUNINGS = [
    (direct_read, "MONARCH_DIRECT_READ", "_read_loop"),
    (write_through, "MONARCH_WRITE_THROUGH", "_flush_pending"),
]


@pytest.mark.parametrize(("module", "setting", "replaced"), TUNINGS)
def test_a_connection_it_cannot_tune_is_left_as_nats_py_made_it(
    module, setting, replaced, nats_url, monkeypatch
):
    assert module.install(types.SimpleNamespace(is_connected=True)) is False  # no internals
    assert module.install(Client()) is False  # not connected

    monkeypatch.setenv(setting, "0")
    settings.cache_clear()
    try:

        async def main() -> bool:
            nc = await nats.connect(nats_url)
            try:
                return module.install(nc) or replaced in vars(nc)
            finally:
                await nc.close()

        assert run_in_own_loop(main()) is False
    finally:
        monkeypatch.undo()
        settings.cache_clear()


@pytest.mark.parametrize("setting", [s for _, s, _ in TUNINGS])
@pytest.mark.parametrize("value", ["yes-please", "2"])
def test_a_bad_setting_is_refused_by_name(setting, value, monkeypatch):
    monkeypatch.setenv(setting, value)
    with pytest.raises(ValueError, match=setting):
        type(settings()).from_env()
