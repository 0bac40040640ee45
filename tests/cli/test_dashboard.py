"""``monarch dashboard`` against a real job, read by a real headless Chromium.

Chromium runs the page's script (it fetches /api/model and draws with
Plotly) and dumps the DOM it ends with; the test reads the mesh names, the
states and Plotly's ``main-svg`` from it. A screenshot is kept as an
artefact (its path is printed). Skipped only where /usr/bin/chromium is
missing (CI installs it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.cli.watching import Job, artefact_dir, watch_env
from tests.hosts.agents import ROOT

CHROMIUM = "/usr/bin/chromium"
# A job starts several processes: on a busy machine that takes a while.
pytestmark = pytest.mark.timeout(420)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="no /usr/bin/chromium to load the page in (apt install chromium)",
)


class Dashboard:
    """``monarch dashboard --port 0`` in the background; ``url`` is the one it prints."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "monarch.cli.main", "dashboard", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        m = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        if m is None:
            self.stop()
            raise AssertionError(
                f"no URL from monarch dashboard: {line!r} {self.proc.stderr.read()}"
            )  # type: ignore[union-attr]
        self.url = m.group(1)

    def api(self, path: str = "api/model") -> dict:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def stop(self) -> str:
        """Ctrl-C it; what it wrote to stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.stderr.read()  # type: ignore[union-attr]


def chromium(tmp_path: Path, *args: str) -> str:
    profile = tmp_path / ("profile-" + uuid.uuid4().hex[:6])
    out = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout


def wait_api(dash: Dashboard, ok, what: str, timeout: float = 150) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    model: dict = {}
    while time.monotonic() < deadline:
        model = dash.api()
        if ok(model):
            return model
        time.sleep(0.5)
    raise AssertionError(f"the dashboard's model never showed {what}: {json.dumps(model)[:3000]}")


def _states(model: dict) -> set[str]:
    return {
        a["state"]
        for h in model["hosts"]
        for p in h["procs"]
        for m in p["meshes"]
        for a in m["actors"]
    }


@needs_chromium
def test_dashboard_page_shows_the_job_and_draws_plots(nats_url, tmp_path):
    job = Job(nats_url)
    dash = Dashboard(job.env)
    try:
        model = wait_api(
            dash,
            lambda m: (
                {"serving", "stalled", "failed"} <= _states(m)
                and any(s["rate"] and s["rate"][-1] for s in m["history"]["endpoints"])
            ),
            "the states and a rate",
        )
        assert dash.api("api/history")["endpoints"]
        assert nats_url.split("//")[-1] not in json.dumps(model)  # no broker address (nor token)
        dom = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=8000", dash.url)
        for word in ("workers", "sleepy", "doomed", "boom: this actor was broken on purpose"):
            assert word in dom
        for state in ("serving", "stalled", "failed"):
            assert f'class="state {state}"' in dom
        assert dom.count('class="main-svg"') >= 4  # Plotly drew the plots
        shot = artefact_dir(tmp_path) / "dashboard.png"
        chromium(
            tmp_path,
            f"--screenshot={shot}",
            "--window-size=1400,1000",
            "--virtual-time-budget=8000",
            dash.url,
        )
        assert shot.stat().st_size > 10_000
        print(f"\nmonarch dashboard screenshot saved: {shot}")

        assert job.end() == 0
        ended = wait_api(dash, lambda m: m["status"] == "ended", "the job's end")
        assert "job ended" in ended["message"]
        dom = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=4000", dash.url)
        assert "job ended" in dom
    finally:
        job.end()
        err = dash.stop()
    assert "Traceback" not in err


def test_dashboard_port_in_use_is_a_clear_error(nats_url):
    env = watch_env(nats_url, "nojob" + uuid.uuid4().hex[:8])
    first = Dashboard(env)
    try:
        port = first.url.rsplit(":", 1)[1].strip("/")
        out = subprocess.run(
            [sys.executable, "-m", "monarch.cli.main", "dashboard", "--port", port],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "Traceback" not in out.stderr
        assert first.api()["status"] == "waiting"  # no job in that namespace
    finally:
        first.stop()
