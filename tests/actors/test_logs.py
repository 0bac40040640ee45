"""Log forwarding: actors' stdout, stderr and log records reach the client, prefixed and folded.

The client prints forwarded lines from its runtime's loop thread, so each test
polls ``capsys`` (bounded) until the text it expects has arrived.
"""

from __future__ import annotations

import inspect
import logging
import re
import time

import pytest

from monarch.actor import this_host
from tests.actors.actors_for_tests import AsyncPrinter, Printer, TwoThreadPrinter
from tests.helpers import proc_mesh_fixture


class Captured:
    """Everything the client printed so far, read from ``capsys``/``capfd`` as it comes."""

    def __init__(self, capture) -> None:
        self.capture = capture
        self.out = ""
        self.err = ""

    def read(self) -> Captured:
        got = self.capture.readouterr()
        self.out += got.out
        self.err += got.err
        return self

    def wait_for(self, text: str, where: str = "out", timeout: float = 20.0) -> str:
        """Poll until ``text`` was printed to stdout (or stderr); the captured text."""
        deadline = time.monotonic() + timeout
        while True:
            seen = getattr(self.read(), where)
            if text in seen:
                return seen
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{text!r} not printed to std{where} within {timeout} s:\n{seen}"
                )
            time.sleep(0.02)


procs = proc_mesh_fixture({"gpus": 4}, name="logged")


@pytest.fixture
def printer(procs):
    return procs.spawn("printer", Printer)


def test_print_from_sync_endpoint_reaches_client_with_actor_and_rank(procs, printer, capsys):
    # Applied when it returns; what it returns is awaitable too, as Monarch's coroutine is
    done = procs.logging_option(stream_to_client=True, aggregate_window_sec=None)
    assert inspect.isawaitable(done) and done.get(timeout=5) is None
    printer.slice(gpus=2).say.call_one("hello from a proc").get(timeout=30)
    cap = Captured(capsys)
    out = cap.wait_for("[printer[2]] hello from a proc\n")
    assert out.count("hello from a proc") == 1
    aprinter = procs.spawn("aprinter", AsyncPrinter)
    aprinter.slice(gpus=1).say_async.call_one("hello from the loop").get(timeout=30)
    cap.wait_for("[aprinter[1]] hello from the loop\n")


def test_stderr_reaches_client_stderr(procs, printer, capsys):
    procs.logging_option(stream_to_client=True)
    printer.slice(gpus=3).say_err.call_one("something odd").get(timeout=30)
    cap = Captured(capsys)
    cap.wait_for("[printer[3]] something odd\n", where="err")
    assert "something odd" not in cap.out


def test_print_outside_actor_context_is_prefixed_with_proc_uid(procs, printer, capsys):
    procs.logging_option(stream_to_client=True)
    printer.slice(gpus=1).say_from_thread.call_one("from a bare thread").get(timeout=30)
    out = Captured(capsys).wait_for("from a bare thread")
    assert re.search(r"^\[logged-[0-9a-f]+-1\] from a bare thread$", out, re.M), out


def test_logging_records_arrive_with_level_and_level_filters(procs, printer, capsys):
    procs.logging_option(stream_to_client=True, level=logging.WARNING)
    one = printer.slice(gpus=1)
    one.info.call_one("quiet detail").get(timeout=30)
    one.warn.call_one("careful now").get(timeout=30)
    cap = Captured(capsys)
    err = cap.wait_for("careful now", where="err")
    # the record's message starts with the actor's name, as in Monarch
    me = "[actor=<root>.<tests.actors.actors_for_tests.Printer printer{'gpus': 1/4}>]"
    assert f"[printer[1]] WARNING monarch.actor.printer: {me} careful now\n" in err
    assert "quiet detail" not in err  # sent before the warning, so it would be here by now
    procs.logging_option(stream_to_client=True, level=logging.INFO)
    one.info.call_one("now audible").get(timeout=30)
    err = cap.wait_for("now audible", where="err")
    assert f"[printer[1]] INFO monarch.actor.printer: {me} now audible\n" in err
    assert "careful now" not in cap.out


def test_identical_lines_from_many_ranks_fold_into_one(procs, printer, capsys):
    procs.logging_option(stream_to_client=True, aggregate_window_sec=3)
    printer.say.call("loss 0.5").get(timeout=30)
    printer.say.call("step", rank_suffix=True).get(timeout=30)
    cap = Captured(capsys)
    out = cap.wait_for("[4 similar log lines] loss 0.5\n")
    assert out.count("loss 0.5") == 1
    for r in range(4):  # different lines stay apart, each with its own prefix
        out = cap.wait_for(f"[printer[{r}]] step {r}\n")
    assert "similar log lines] step" not in out


def test_stream_to_client_false_keeps_output_on_the_procs(nats_url, capfd, monkeypatch):
    # capfd is active before the procs start, so it also sees what they write themselves;
    # procs forked by the session's zygote would write to the stdout the session began with.
    from monarch.settings import settings

    monkeypatch.setenv("MONARCH_ZYGOTE", "0")
    settings.cache_clear()
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="quiet")
    pm.initialized.get(timeout=60)  # started (as plain children) before the setting goes back
    monkeypatch.delenv("MONARCH_ZYGOTE")
    settings.cache_clear()
    try:
        printer = pm.spawn("printer", Printer)
        pm.logging_option(stream_to_client=False)
        printer.say.call("kept local").get(timeout=30)
        pm.logging_option(stream_to_client=True)
        printer.say.call("streamed again").get(timeout=30)
        cap = Captured(capfd)
        cap.wait_for("[printer[0]] streamed again\n")
        cap.wait_for("[printer[1]] streamed again\n")
    finally:
        pm.stop().get(timeout=30)
    out = cap.read().out
    assert not re.search(r"\] kept local", out), out  # the client printed none of them
    assert out.count("kept local\n") == 2  # each proc wrote its own, unprefixed


def test_lines_printed_just_before_stop_are_not_lost(nats_url, capsys):
    pm = this_host().spawn_procs(per_host={"gpus": 4}, name="brief")
    pm.logging_option(stream_to_client=True, aggregate_window_sec=3)  # lines wait in a window
    printer = pm.spawn("printer", Printer, farewell="goodbye from cleanup")
    printer.say.call("warming up").get(timeout=30)
    printer.say.broadcast("last words")
    pm.stop().get(timeout=30)
    out = Captured(capsys).read().out  # printed by the time stop() completes
    assert "[4 similar log lines] warming up\n" in out
    assert "[4 similar log lines] last words\n" in out
    assert "[4 similar log lines] goodbye from cleanup\n" in out


def test_a_new_proc_mesh_prints_each_line_before_the_reply_of_the_call_that_printed_it(
    nats_url, capsys
):
    # In Monarch 0.7 procs write to the terminal they inherited, so a line an endpoint
    # printed is there before its call returns. Ours stream it, and send it before the reply.
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="prompt")
    try:
        sync, loop = pm.spawn("printer", Printer), pm.spawn("aprinter", AsyncPrinter)
        cap = Captured(capsys)
        for i in range(5):  # faster than the forwarder's FLUSH_DELAY: the reply pushes them out
            sync.slice(gpus=1).say.call_one(f"sync line {i}").get(timeout=30)
            assert cap.read().out.endswith(f"[printer[1]] sync line {i}\n"), cap.out
            loop.slice(gpus=0).say_async.call_one(f"loop line {i}").get(timeout=30)
            assert cap.read().out.endswith(f"[aprinter[0]] loop line {i}\n"), cap.out
        sync.say.call("both ranks").get(timeout=30)
        assert sorted(cap.read().out.splitlines()[-2:]) == [
            "[printer[0]] both ranks",
            "[printer[1]] both ranks",
        ]
    finally:
        pm.stop().get(timeout=30)


def test_lines_of_each_thread_arrive_in_the_order_printed_while_they_race(procs, capsys):
    # Two threads of one actor print numbered lines as fast as they can: the loop sends
    # queued lines before anything else, and a flush that finds more lines queued while it
    # sends leaves them for the next one, so no line overtakes an earlier one of its thread.
    procs.logging_option(stream_to_client=True)
    racer = procs.slice(gpus=0).spawn("racer", TwoThreadPrinter)
    cap = Captured(capsys)
    for _ in range(3):
        eps = racer.race.call_one(20_000).get(timeout=120)
        cap.wait_for(f"[racer[0]] ep {eps - 1}\n")
        cap.wait_for("] seq 19999\n")  # a bare thread's lines carry the proc's uid
        lines = [x.split("] ", 1)[1] for x in cap.read().out.splitlines() if "] " in x]
        for name, count in (("seq", 20_000), ("ep", eps)):
            got = [int(x.split()[1]) for x in lines if x.startswith(f"{name} ")]
            assert got == list(range(count)), f"{name} lines out of order or missing"
        cap.out = ""


def test_logging_option_defaults_are_monarchs(procs, printer, capfd):
    # logging_option() is Monarch 0.7's: stream_to_client=False, no window; a window
    # without streaming is Monarch's RuntimeError
    with pytest.raises(RuntimeError, match="cannot set aggregate window without streaming"):
        procs.logging_option(aggregate_window_sec=3)
    try:
        procs.logging_option()
        printer.slice(gpus=0).say.call_one("stays with the proc").get(timeout=30)
        procs.logging_option(stream_to_client=True)
        printer.slice(gpus=0).say.call_one("streamed").get(timeout=30)
        out = Captured(capfd).wait_for("[printer[0]] streamed\n")
        assert "] stays with the proc" not in out  # the client printed no prefixed copy
    finally:
        procs.logging_option(stream_to_client=True)


def test_logging_option_rejects_bad_values(procs):
    with pytest.raises(ValueError, match="aggregate_window_sec"):
        procs.logging_option(aggregate_window_sec=0)
    with pytest.raises(ValueError, match="logging level"):
        procs.logging_option(level=1000)
    with pytest.raises(TypeError, match="stream_to_client"):
        procs.logging_option(stream_to_client="yes")  # type: ignore[arg-type]
