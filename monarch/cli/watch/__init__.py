"""Watching a running job: the one model behind ``monarch top`` and ``monarch dashboard``.

:mod:`.model` turns what the procs answer (``mon.<ns>.ctl.ps`` and
``mon.<ns>.ctl.stats``) into states, a tree and a bounded history, with
:mod:`.counters` turning growing totals into rates and latencies;
:mod:`.poller` asks for those answers every interval over one NATS connection.
The two views only read the model: :mod:`.text` (plain text, ``top --once``),
:mod:`.top_app` (the Textual app) and :mod:`.web` (the ASGI dashboard).
"""
