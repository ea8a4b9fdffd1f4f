"""Container images for the integration tests, built with buildah (``--isolation chroot``: no daemon, no user
namespaces) from a Debian base made by ``debootstrap``.

What stays on the host between runs, to keep a rebuild within the suite's time: the base image (tag
:data:`BASE_TAG`), buildah's layer cache (``--layers``) and pip's cache (the Dockerfile's ``--mount=type=cache``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

from daemons import which

BASE_TAG = "localhost/dlrm-v2-test-base:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# The host's trust store and pip settings go into the base so that pip inside the build reaches the package
# index the way the host does (through the same TLS certificates).
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# torch's CPU wheels: where the host keeps them, mounted at /wheels during the build (a pip find-links dir)
WHEEL_DIR = Path("/opt/wheels")
WHEELS_IN_BUILD = "/wheels"
CONTAINER_HOST = "dlrm-v2-test"


def buildah(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([which("buildah"), *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args)}: status {p.returncode}\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p


def image_exists(tag: str) -> bool:
    return buildah("images", "-q", tag, check=False).returncode == 0


def debian_base(tag: str = BASE_TAG) -> float:
    """Make ``tag`` from ``debootstrap --variant=minbase bookworm`` unless it exists; return the seconds taken."""
    if image_exists(tag):
        return 0.0
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="debootstrap-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "root"
        p = subprocess.run(
            [which("debootstrap"), "--variant=minbase", "bookworm", str(root), DEBIAN_MIRROR],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if p.returncode != 0:
            raise RuntimeError(f"debootstrap failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        (root / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True)
        if HOST_CA.is_file():
            (root / "etc" / "ssl").mkdir(exist_ok=True)
            shutil.copyfile(HOST_CA, root / "etc" / "ssl" / "host-ca-certificates.crt")
            (root / "etc" / "pip.conf").write_text(
                f"[global]\ncert = /etc/ssl/host-ca-certificates.crt\nfind-links = {WHEELS_IN_BUILD}\n"
            )
        ctr = buildah("from", "scratch").stdout.strip()
        try:
            buildah("copy", ctr, f"{root}/", "/")
            buildah("config", "--cmd", "/bin/bash", "--env", "LANG=C.UTF-8", ctr)
            buildah("commit", "--rm", ctr, tag)
        except BaseException:
            buildah("rm", ctr, check=False)
            raise
    return time.monotonic() - start


def build(context: Path, tag: str, build_args: List[str], volumes: Optional[List[str]] = None) -> float:
    """``buildah bud`` of ``context``'s Dockerfile as ``tag``; return the seconds taken."""
    start = time.monotonic()
    args = ["bud", "--isolation", "chroot", "--layers", "-t", tag]
    for a in build_args:
        args += ["--build-arg", a]
    for v in volumes or []:
        args += ["-v", v]
    buildah(*args, str(context), timeout=1800)
    return time.monotonic() - start


def image_size_mb(tag: str) -> float:
    out = buildah("inspect", "--type", "image", "--format", "{{.Docker.Size}}", tag, check=False).stdout.strip()
    if out.isdigit() and int(out) > 0:
        return int(out) / 2**20
    # the layers' uncompressed sizes, as `buildah images` lists them
    line = buildah("images", "--format", "{{.Size}}", tag).stdout.strip()
    num, unit = line.split()
    return float(num) * {"B": 2**-20, "KB": 1 / 1024, "MB": 1, "GB": 1024}[unit.upper()]


def run_in(tag: str, cmd: List[str], timeout: float, workdir: str = "/workspace/dlrm") -> subprocess.CompletedProcess:
    """Run ``cmd`` in a working container of ``tag`` (``buildah run --isolation chroot``) and remove it. As in
    Docker, the container's host name resolves, to 127.0.0.1 (a debootstrap tree has no /etc/hosts): torchrun's
    rendezvous serves its store at the host name."""
    ctr = buildah("from", "--add-host=localhost:127.0.0.1", f"--add-host={CONTAINER_HOST}:127.0.0.1", tag).stdout
    ctr = ctr.strip()
    try:
        return subprocess.run(
            [which("buildah"), "run", "--isolation", "chroot", "--hostname", CONTAINER_HOST, "--workingdir", workdir]
            + [ctr, "--", *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        buildah("rm", ctr, check=False)
