"""docker-compose.yml and docker-compose.cluster.yml, brought up for real on a Docker engine.

The images are built here with no registry and no network inside any
container (:mod:`tests.deploy.compose_images`); each compose project has a name
of its own, publishes the broker on 127.0.0.1 only, on free ports, and is taken
down with its volumes, and the test checks that no container, network or
volume of it is left.

* The single-broker file: a host agent started before the broker comes up
  once the broker does; ``examples/multi_host.py`` runs across two agents; the
  ``monarch`` CLI works inside a container (``docker-compose exec host monarch ps``).
* The three-node cluster file: a client job with actors on each of three host
  containers, then the first NATS node is stopped mid-job (calls go on, new
  procs still start: issue 35's defect), a host container is killed mid-job
  (the client is told, with a clear error, within the call's timeout), both
  come back, and a new mesh spans all three hosts again.

It skips, saying why, only where no Docker engine answers or the base image
cannot be made (.ci/run installs docker.io, docker-compose and debootstrap and
starts dockerd).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from monarch.broker.connections.server import free_port
from tests.deploy import compose_images as ci

ROOT = ci.ROOT
BASE = ROOT / "docker-compose.yml"
CLUSTER = ROOT / "docker-compose.cluster.yml"
SECRETS = (
    "MONARCH_NATS_TOKEN",
    "MONARCH_NATS_PASSWORD",
    "MONARCH_NATS_CREDS",
    "MONARCH_NATS_JOB_KEY",
)

# Alone: it builds images and stops and kills broker nodes and hosts in containers, timed
# against their failover (tests/turns.py).
pytestmark = [pytest.mark.timeout(900), pytest.mark.alone]


@dataclass
class Images:
    monarch: str
    nats: str
    seconds: float  # to make them (cold: debootstrap and pip; warm: the monarch image only)


@pytest.fixture(scope="module")
def images():
    problem = ci.engine_problem()
    if problem:
        pytest.skip(f"no container engine: {problem}")
    start = time.monotonic()
    try:
        with ThreadPoolExecutor(2) as pool:  # debootstrap and pip at once
            base, wheels = pool.submit(ci.base_image), pool.submit(ci.wheelhouse)
            base, wheels = base.result(), wheels.result()
    except ci.Unavailable as e:
        pytest.skip(str(e))
    tag = f"{ci.IMAGE_PREFIX}/monarch:{uuid.uuid4().hex[:8]}"
    try:
        built = Images(ci.monarch_image(base, wheels, tag), ci.nats_image(wheels), 0.0)
        built.seconds = time.monotonic() - start
        print(f"\nimages ready in {built.seconds:.0f} s; {tag}: {ci.image_size(tag) / 1e6:.0f} MB")
        yield built
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
        subprocess.run(
            ["docker", "image", "prune", "-f", "--filter", "label=org.monarch-nats.stage=build"],
            capture_output=True,
            timeout=120,
        )


class Project:
    """One compose project: a unique name, our images, free 127.0.0.1 ports."""

    def __init__(self, images: Images, *files: Path) -> None:
        self.name = f"monarchtest{uuid.uuid4().hex[:8]}"
        self.args = [a for f in files for a in ("-f", str(f))]
        self.env = dict(
            os.environ,
            COMPOSE_PROJECT_NAME=self.name,
            MONARCH_IMAGE=images.monarch,
            NATS_IMAGE=images.nats,
            NATS_ADDRESS="127.0.0.1",
            NATS_PORT=str(free_port()),
            NATS_MONITOR_PORT=str(free_port()),
        )

    def cmd(self, *args: str) -> list[str]:
        return ["docker-compose", *self.args, *args]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True):
        out = subprocess.run(
            self.cmd(*args), env=self.env, cwd=ROOT, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        if check and out.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: {out.stdout}\n{out.stderr}")
        return out

    def containers(self, service: str) -> list[str]:
        return self("ps", "-q", service).stdout.split()

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.name}"
        found = {}
        for what in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
            out = subprocess.run(["docker", *what, "-q", "--filter", label],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            found[what[0]] = out.stdout.split()
        return found

    def down(self) -> None:
        self("down", "-v", "--remove-orphans", "--timeout", "5", timeout=180, check=False)
        left = self.leftovers()
        assert not any(left.values()), f"compose project {self.name} left {left}"

    def logs(self) -> str:
        return self("logs", "--no-color", "--tail", "40", timeout=60, check=False).stdout[-6000:]


@contextlib.contextmanager
def project(images: Images, *files: Path):
    p = Project(images, *files)
    try:
        yield p
    except BaseException:
        print(p.logs())
        raise
    finally:
        p.down()


def test_image_is_small_unprivileged_and_holds_no_secret(images):
    size = ci.image_size(images.monarch)
    print(f"\n{images.monarch}: {size / 1e6:.0f} MB")
    assert size < 300e6
    probe = (
        "id -u; env; find / -xdev \\( -name '*.creds' -o -name '*.nk' -o -name 'id_rsa*' "
        "-o -name '.netrc' -o -name '.pypirc' -o -name 'pip.conf' \\) -print 2>/dev/null; "
        "ls /root/.cache /home/monarch/.cache 2>/dev/null; true"
    )
    out = ci.run(["docker", "run", "--rm", "--network", "none", images.monarch, "sh", "-c", probe],
                 timeout=120).stdout.split("\n")  # fmt: skip
    assert out[0] != "0", "the image runs as root"
    assert not [line for line in out if line.startswith(SECRETS)], out
    assert not [line for line in out[1:] if line.startswith("/")], out  # no key, creds, pip conf
    history = ci.run(["docker", "history", "--no-trunc", images.monarch], timeout=60).stdout
    assert not any(s in history for s in SECRETS)


def test_single_broker_file_runs_the_example_and_the_cli(images):
    with project(images, BASE) as p:
        # An agent started before the broker: it keeps trying, and is there once it is.
        p("up", "-d", "--no-deps", "host")
        time.sleep(3)
        start = time.monotonic()
        p("up", "-d", "--scale", "host=2")
        ran = p("run", "--rm", "-T", "client", "python", "examples/multi_host.py", "--hosts",
                "2", "--timeout", "120", timeout=300)  # fmt: skip
        print(f"\nsingle broker: up to the example's end in {time.monotonic() - start:.1f} s")
        hosts = {c for c in p.containers("host")}
        lines = [x for x in ran.stdout.splitlines() if " pid " in x]
        assert len(lines) == 4, ran.stdout + ran.stderr
        assert len({x.split()[0] for x in lines}) == 2  # two containers, two procs each
        assert all(any(x.startswith(h[:12]) for h in hosts) for x in lines), (hosts, lines)
        assert "0.30000000000000004" in ran.stdout or "0.3" in ran.stdout
        ps = p("exec", "-T", "host", "monarch", "ps", "--json", timeout=120)
        listed = json.loads(ps.stdout)
        assert len(listed["hosts"]) >= 2, ps.stdout


CLIENT = """
import json, socket, sys, time
import monarch.actor
from monarch.actor import Actor, attach_to_workers, endpoint

faults = []
monarch.actor.unhandled_fault_hook = lambda failure: faults.append(str(failure)[:300])


class Probe(Actor):
    @endpoint
    def host(self) -> str:
        return socket.gethostname()

    @endpoint
    def ping(self, i: int) -> int:
        return i


def say(phase, **kw):
    print(json.dumps({"phase": phase, **kw}), flush=True)


def go():
    if not sys.stdin.readline():
        sys.exit("stdin closed")


def mesh_on(n):
    procs = attach_to_workers(hosts=n, timeout=120).spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("probe", Probe)
    return procs, mesh, sorted(mesh.host.call().get(timeout=60).values())


def calls(mesh, n):
    out = []
    for i in range(n):
        t = time.monotonic()
        try:
            ok = sorted(mesh.ping.call(i).get(timeout=30).values()) == [i] * N
            out.append(["ok" if ok else "wrong", round(time.monotonic() - t, 2)])
        except Exception as e:
            out.append([type(e).__name__, round(time.monotonic() - t, 2), str(e)[:200]])
        time.sleep(0.1)
    return out


N = int(sys.argv[1])
procs, mesh, hosts = mesh_on(N)
say("up", hosts=hosts)
go()  # the first NATS node is stopped
during = calls(mesh, 10)
procs2, _, hosts2 = mesh_on(N)  # procs started after the node stopped (issue 35)
procs2.stop().get(timeout=60)
say("node-stopped", calls=during, hosts=hosts2)
go()  # a host container is killed
t, error = time.monotonic(), None
for i in range(60):
    try:
        mesh.ping.call(i).get(timeout=30)
    except Exception as e:
        error = [type(e).__name__, str(e)[:300]]
        break
    time.sleep(0.25)
say("host-killed", error=error, seconds=round(time.monotonic() - t, 2), faults=faults)
go()  # the node and the container are back
procs3, _, hosts3 = mesh_on(N)
procs3.stop().get(timeout=60)
say("restarted", hosts=hosts3)
"""


class Job:
    """The client above in a ``docker-compose run`` container, stepped through stdin."""

    def __init__(self, p: Project, hosts: int) -> None:
        self.popen = subprocess.Popen(
            p.cmd("run", "--rm", "-T", "client", "python", "-c", textwrap.dedent(CLIENT),
                  str(hosts)),
            env=p.env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.seen: list[str] = []

    def phase(self, name: str, timeout: float) -> dict:
        """The client's report of ``name``, read within ``timeout`` s (it must not hang)."""
        fd, deadline = self.popen.stdout.fileno(), time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                line = self.popen.stdout.readline()
                if not line:
                    break
                self.seen.append(line.rstrip())
                if line.startswith('{"phase"'):
                    report = json.loads(line)
                    assert report["phase"] == name, self.seen
                    return report
        raise AssertionError(
            f"no {name!r} from the client in {timeout} s:\n" + "\n".join(self.seen[-40:])
        )

    def go(self) -> None:
        self.popen.stdin.write("go\n")
        self.popen.stdin.flush()

    def close(self) -> int:
        with contextlib.suppress(BrokenPipeError):
            self.popen.stdin.close()
        try:
            return self.popen.wait(60)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
            raise


def test_cluster_file_survives_a_stopped_node_and_a_killed_host(images):
    with project(images, BASE, CLUSTER) as p:
        start = time.monotonic()
        p("up", "-d", "--scale", "host=3")
        job = Job(p, 3)
        try:
            up = job.phase("up", 240)
            print(f"\ncluster: up to a mesh on 3 hosts in {time.monotonic() - start:.1f} s")
            hosts = p.containers("host")
            assert len(set(up["hosts"])) == 3 and {h[:12] for h in hosts} == set(up["hosts"])

            p("stop", "-t", "5", "nats")
            job.go()
            stopped = job.phase("node-stopped", 240)
            # Every call ends: it answers, or is reported lost (MessageLostError or
            # BrokerLostError for one in flight through the node); none hangs.
            outcomes = [c[0] for c in stopped["calls"]]
            assert set(outcomes) <= {"ok", "MessageLostError", "BrokerLostError"}, stopped
            assert outcomes[-1] == "ok", stopped
            assert sorted(stopped["hosts"]) == sorted(up["hosts"])  # new procs on every host

            victim = hosts[0]
            ci.run(["docker", "kill", victim], timeout=60)
            job.go()
            killed = job.phase("host-killed", 240)
            assert killed["error"] is not None, killed
            assert killed["error"][0] == "SupervisionError", killed  # a clear error, not a hang
            print(f"host kill reported after {killed['seconds']} s: {killed['error']}")

            p("start", "nats")
            ci.run(["docker", "start", victim], timeout=60)
            job.go()
            back = job.phase("restarted", 240)
            assert sorted(back["hosts"]) == sorted(up["hosts"])
            assert job.close() == 0, "\n".join(job.seen[-40:])
            # The CLI inside a container, against the cluster. Seconds after a server's
            # restart it once read an empty hosts bucket (that server's JetStream was
            # still catching up): a snapshot, so it may ask again for a while.
            deadline, names = time.monotonic() + 30, set()
            while not names >= set(up["hosts"]) and time.monotonic() < deadline:
                out = p("exec", "-T", "host", "monarch", "ps", "--json", timeout=120).stdout
                names = {h["name"] for h in json.loads(out)["hosts"]}
            assert names >= set(up["hosts"]), out
        finally:
            if job.popen.poll() is None:
                job.popen.kill()
                job.popen.wait(10)
