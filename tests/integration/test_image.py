"""The Dockerfile built for real: the CPU stack (``--build-arg STACK=cpu``) on a Debian bookworm base made with
debootstrap, built with buildah, then the README's smoke test (``python train.py``, the synthetic default) and a
2-rank ``torchrun`` run inside it; the 2-rank run must match the same command on the host's pinned CPU stack
(same torch, fbgemm-gpu-cpu and torchrec builds: same losses and AUC).

    make integration          # or: python -m pytest -m integration tests/integration/test_image.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from daemons import needs_root_and_packages
from images import BASE_TAG, WHEEL_DIR, WHEELS_IN_BUILD, build, buildah, debian_base, image_size_mb, run_in

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TAG = "localhost/dlrm-v2:test-cpu"
SHORT = [
    "trainer.max_steps=40",
    "data.num_train_samples=20480",
    "data.num_val_samples=2048",
    "logger.log_every_n_steps=20",
    "eval.every_n_steps=null",
]
FINAL = re.compile(r"^final validation AUC (0\.\d+) \(logloss (\d\.\d+), ([\d,]+) samples\) after (\d+) steps", re.M)
STEP = re.compile(r"^(?:\[default0\]:)?step +(\d+)/\d+ \| epoch [\d.]+ \| loss (\d\.\d+)", re.M)


def _torch_wheel() -> List[Path]:
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return sorted(WHEEL_DIR.glob(f"torch-2.13.0+cpu-{py}-*.whl")) if WHEEL_DIR.is_dir() else []


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    why = needs_root_and_packages(["buildah", "debootstrap"])
    if why:
        pytest.skip(why)
    base_s = debian_base()
    # torch's CPU wheel index may be out of reach: a local copy of the wheel (bookworm's Python is 3.11) is
    # offered beside PyPI, whose own torch 2.13.0 is the CUDA build; the build refuses a CUDA torch for STACK=cpu
    args, volumes = ["STACK=cpu", f"BASE_IMAGE={BASE_TAG}"], []
    if _torch_wheel():
        args.append("TORCH_INDEX_URL=https://pypi.org/simple")
        volumes.append(f"{WHEEL_DIR}:{WHEELS_IN_BUILD}:ro")
    old = buildah("images", "-q", "--no-trunc", TAG, check=False).stdout.split()
    build_s = build(REPO, TAG, args, volumes)
    # the previous build of the tag, superseded: its layers are no cache for the next build (they held older code)
    new = buildah("images", "-q", "--no-trunc", TAG).stdout.split()
    for image_id in set(old) - set(new):
        buildah("rmi", image_id, check=False)
    size = image_size_mb(TAG)
    sys.__stdout__.write(
        f"\nimage {TAG}: {size:,.0f} MiB; built in {build_s:.0f} s"
        f" (Debian base {'cached' if base_s == 0 else f'made in {base_s:.0f} s'})\n"
    )
    yield TAG


def _on_host(cmd: List[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """``cmd`` on the host's pinned CPU stack, from the repository root, its run directory under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLRM_", "TORCHX_", "TORCHELASTIC_"))}
    env.update(DLRM_OUTPUT_ROOT=str(tmp_path), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_train_py_in_the_image_finishes_the_synthetic_default_with_an_auc(image: str, tmp_path: Path) -> None:
    """The README's ``docker run ... dlrm-v2:0.1.0`` smoke test: the image's CMD, ``python train.py``. Its figures
    equal the host stack's on this machine; the README's, from another x86-64 CPU, agree to its last digits (the
    README says they can differ there: the CPU's matrix kernels round differently)."""
    cmd = buildah("inspect", "--type", "image", "--format", "{{.Docker.Config.Cmd}}", image).stdout.strip()
    assert cmd == "[python train.py]"
    p = run_in(image, ["python", "train.py"], timeout=1200)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    host = _on_host(["python", "train.py"], tmp_path)
    assert host.returncode == 0, (host.stdout + host.stderr)[-3000:]
    final, want = FINAL.search(out), FINAL.search(host.stdout + host.stderr)
    assert final and final.group(3) == "16,384" and final.group(4) == "512", out[-3000:]
    assert want and final.groups() == want.groups(), (final.group(0), want.group(0))
    readme = FINAL.search((REPO / "README.md").read_text())
    assert readme and readme.group(3, 4) == final.group(3, 4), readme
    for i in (1, 2):  # AUC, logloss
        assert abs(float(readme.group(i)) - float(final.group(i))) <= 2e-4, (final.group(0), readme.group(0))


def test_two_rank_torchrun_in_the_image_matches_the_host_stack(image: str, tmp_path: Path) -> None:
    cmd = ["torchrun", "--standalone", "--nproc_per_node", "2", "train.py", *SHORT]
    p = run_in(image, cmd, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    start = time.monotonic()
    host = _on_host(cmd, tmp_path)
    assert host.returncode == 0, (host.stdout + host.stderr)[-3000:]
    got, want = FINAL.search(out), FINAL.search(host.stdout + host.stderr)
    assert got and want and got.group(4) == "40", out[-3000:]
    assert got.groups() == want.groups(), (got.group(0), want.group(0), f"host run {time.monotonic() - start:.0f} s")
    assert STEP.findall(out) == STEP.findall(host.stdout + host.stderr) != []
