"""Packaging: ``make venv`` installs each stack (CPU, ``STACK=gpu``, ``STACK=cpu-1.9``) in its order, the
Dockerfile's pins agree with the Makefile's, pyproject.toml's and requirements.txt's, and ``pip install -e .`` gives
a ``dlrm-train`` console script that trains like train.py from any directory.

    .venv/bin/python -m pytest tests/test_launch_packaging.py -q
"""

import json
import re
import site
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import tomllib

from conftest import REPO, make_env

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DOCKERFILE = (REPO / "Dockerfile").read_text()
PIN = re.compile(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lines) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for line in lines:
        m = PIN.fullmatch(line.split("#")[0].strip())
        if m:
            out[_norm(m.group(1))] = m.group(2)
    return out


def _stack_branch(stack: str) -> str:
    """The Dockerfile's install commands for build argument ``STACK=<stack>`` (its ``case`` branch)."""
    m = re.search(rf"^\s+{stack}\) (.*?);;", DOCKERFILE, re.M | re.S)
    assert m, f"no STACK={stack} branch in the Dockerfile"
    return m.group(1)


def _installed(branch: str) -> Dict[str, str]:
    return {
        _norm(n): v
        for n, v in re.findall(r"pip install[^;\n]*?\b(torch|fbgemm-gpu(?:-cpu)?|torchrec)==([\w.+-]+)", branch)
    }


def _make_steps(tmp_path: Path, *args: str) -> List[str]:
    """The pip arguments of ``make -n venv <args>`` in order (a dry run: nothing is installed)."""
    p = subprocess.run(
        ["make", "-n", "-C", str(REPO), "venv", f"VENV={tmp_path / 'venv'}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=make_env(),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return [line.split(" install -q ", 1)[1].strip() for line in p.stdout.splitlines() if " -m pip " in line]


def test_make_venv_installs_each_stack_in_order(tmp_path: Path) -> None:
    """torch, its FBGEMM build, the pure-Python pins, then torchrec without its declared dependencies; the GPU
    stack's wheels from the Dockerfile's CUDA index, at the Dockerfile's and the `gpu` extra's pins."""
    cpu = _make_steps(tmp_path)
    assert cpu == ["torch==2.13.0", "fbgemm-gpu-cpu==1.8.0", "-r requirements.txt", "--no-deps torchrec==1.8.0"]
    assert _make_steps(tmp_path, "STACK=cpu") == cpu
    index = re.search(r"gpu\) index=\$\{TORCH_INDEX_URL:-(\S+)\}", DOCKERFILE).group(1)
    docker = _installed(_stack_branch("gpu"))
    gpu = _make_steps(tmp_path, "STACK=gpu")
    assert gpu == [
        f"torch=={docker['torch']} --index-url {index}",
        f"fbgemm-gpu=={docker['fbgemm-gpu']} --index-url {index}",
        "-r requirements.txt",
        f"--no-deps torchrec=={docker['torchrec']}",
    ]
    assert f"pip install --no-deps torchrec=={docker['torchrec']}" in _stack_branch("gpu")
    cpu19 = ["torch==2.14.1", "fbgemm-gpu-cpu==1.9.0", "-r requirements.txt", "--no-deps torchrec==1.9.2"]
    assert _make_steps(tmp_path, "STACK=cpu-1.9") == cpu19
    assert _make_steps(tmp_path, "STACK=cpu-1.9", "TORCH_PIP_ARGS=--index-url X")[0] == "torch==2.14.1 --index-url X"
    extra = _pins(PYPROJECT["project"]["optional-dependencies"]["gpu"])
    assert extra == {"torch": docker["torch"], "fbgemm-gpu": docker["fbgemm-gpu"]}
    # the interpreter running this test has one of the two stacks, at its pins
    from importlib.metadata import version

    got = [version(p).split("+")[0] for p in ("torch", "torchrec")]
    assert got in (["2.13.0", "1.8.0"], ["2.14.1", "1.9.2"], [docker["torch"], docker["torchrec"]])
    readme = (REPO / "README.md").read_text()
    assert "make venv STACK=gpu" in readme and "make train STACK=gpu" in readme and "STACK=cpu-1.9" in readme


def test_make_refuses_to_mix_stacks_in_one_venv(tmp_path: Path) -> None:
    """A venv holding one stack is not overlaid with the other (two FBGEMM builds, two torch builds): exit 2 and
    one error line before pip runs; an unknown STACK is refused too."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()  # what `make venv` (the CPU stack) leaves
    p = subprocess.run(
        ["make", "-C", str(REPO), "venv", "STACK=gpu", f"VENV={venv}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=make_env(),
    )
    assert p.returncode == 2
    assert f"error: {venv} holds the CPU stack, not STACK=gpu: run make clean first" in p.stderr
    assert not (venv / "bin").exists() and not (venv / ".installed-gpu").exists()
    (venv / ".installed").unlink()
    (venv / ".installed-gpu").touch()
    p = subprocess.run(
        ["make", "-C", str(REPO), "venv", f"VENV={venv}"], capture_output=True, text=True, timeout=60, env=make_env()
    )
    assert p.returncode == 2 and f"error: {venv} holds the GPU stack, not STACK=cpu" in p.stderr
    assert not (venv / "bin").exists() and not (venv / ".installed").exists()
    (venv / ".installed-gpu").unlink()
    (venv / ".installed-cpu-1.9").touch()  # what `make venv STACK=cpu-1.9` leaves
    p = subprocess.run(
        ["make", "-C", str(REPO), "venv", f"VENV={venv}"], capture_output=True, text=True, timeout=60, env=make_env()
    )
    assert p.returncode == 2 and f"error: {venv} holds the CPU 1.9 stack, not STACK=cpu" in p.stderr
    assert not (venv / "bin").exists() and not (venv / ".installed").exists()
    p = subprocess.run(
        ["make", "-C", str(REPO), "-n", "venv", "STACK=cuda"], capture_output=True, text=True, env=make_env()
    )
    assert p.returncode == 2 and "STACK=cuda: use STACK=cpu (the default), STACK=gpu or STACK=cpu-1.9" in p.stderr


def test_dockerfile_pins_the_gpu_stack() -> None:
    gpu = _installed(_stack_branch("gpu"))
    assert set(gpu) == {"torch", "fbgemm-gpu", "torchrec"}
    assert _pins(PYPROJECT["project"]["optional-dependencies"]["gpu"]) == {k: gpu[k] for k in ("torch", "fbgemm-gpu")}
    asserted = re.search(r"'gpu': \('([\w.]+)', '([\w.]+)', '([\w.]+)'\)", DOCKERFILE)
    assert asserted and asserted.groups() == (gpu["torch"], gpu["fbgemm-gpu"], gpu["torchrec"])
    assert re.search(r"^ARG STACK=gpu$", DOCKERFILE, re.M)  # a plain `docker build` gives the cluster image
    # the CUDA build of the wheels matches the base image's CUDA: cu130 <-> nvidia/cuda:13.0.x
    cuda = re.search(r"ARG BASE_IMAGE=nvidia/cuda:(\d+)\.(\d+)\.(\d+)-[\w.-]+", DOCKERFILE)
    index = re.search(r"gpu\) index=\$\{TORCH_INDEX_URL:-\S+/whl/cu(\d+)\}", DOCKERFILE)
    assert cuda and index and index.group(1) == cuda.group(1) + cuda.group(2)
    readme = (REPO / "README.md").read_text()
    stack = f"torch {gpu['torch']} (cu{index.group(1)}), fbgemm-gpu {gpu['fbgemm-gpu']} and torchrec {gpu['torchrec']}"
    assert stack in readme
    assert re.search(r"docker build -t (\S+) \.\ndocker push \1\n", readme)
    assert re.search(r"torchx run -s kubernetes [^`]*--image ", readme)


def test_dockerfile_cpu_stack_is_the_makefiles(tmp_path: Path) -> None:
    """``STACK=cpu`` installs the Makefile's CPU stack, in its order, from torch's CPU index."""
    make = {
        _norm(n): v
        for n, v in re.findall(r"(torch|fbgemm-gpu-cpu|torchrec)==([\w.]+)", " ".join(_make_steps(tmp_path)))
    }
    cpu = _stack_branch("cpu")
    assert set(make) == {"torch", "fbgemm-gpu-cpu", "torchrec"} and _installed(cpu) == make
    assert "index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" in cpu
    assert f"pip install --no-deps torchrec=={make['torchrec']}" in cpu
    asserted = re.search(r"'cpu': \('([\w.]+)', '([\w.]+)', '([\w.]+)'\)", DOCKERFILE)
    assert asserted and asserted.groups() == (make["torch"], make["fbgemm-gpu-cpu"], make["torchrec"])


def test_dockerfile_is_multistage_and_runs_train_py() -> None:
    froms = re.findall(r"^FROM (\S+)", DOCKERFILE, re.M)
    assert len(froms) == 2 and "COPY --from=builder /opt/venv /opt/venv" in DOCKERFILE
    assert "latest" not in DOCKERFILE.split("FROM")[0]  # the base image is a fixed version
    assert re.search(r'^CMD \["python", "train.py"\]$', DOCKERFILE, re.M)
    # torchx passes `bash -c "torchrun ..."` as the container command; an ENTRYPOINT would swallow it
    assert not re.search(r"^ENTRYPOINT", DOCKERFILE, re.M)
    assert re.search(r"pip install -e \.", DOCKERFILE) and "pip install --no-deps -e ." in DOCKERFILE


def test_dockerfile_dependency_layer_does_not_copy_the_readme() -> None:
    """The layer that installs the dependencies is rebuilt only when pyproject.toml changes: it makes the empty
    README.md pyproject's readme= needs, and the source (real README included) comes after it."""
    deps = DOCKERFILE.index("pip install -e .[wandb]")
    copies = re.findall(r"^COPY (?!--from)(.*)$", DOCKERFILE[:deps], re.M)
    assert copies == ["pyproject.toml ./"] and PYPROJECT["project"]["readme"] == "README.md"
    assert "touch dlrm/__init__.py README.md" in DOCKERFILE[:deps]
    assert re.search(r"^COPY \. \.$", DOCKERFILE, re.M).start() > deps


def test_pyproject_and_requirements_pin_the_same_versions() -> None:
    reqs = _pins((REPO / "requirements.txt").read_text().splitlines())
    project = PYPROJECT["project"]
    base = _pins(project["dependencies"])
    dev = _pins(project["optional-dependencies"]["dev"])
    assert set(reqs) == set(base) | set(dev), "requirements.txt is the base dependencies plus the dev extra"
    assert {**base, **dev} == reqs
    assert project["scripts"] == {"dlrm-train": "dlrm.cli:main"}
    assert {"gpu", "wandb", "dev"} <= set(project["optional-dependencies"])


def test_train_py_runs_the_console_script_main() -> None:
    import train  # noqa: F401  (its import must not start a run)
    from dlrm.cli import main

    assert train.main is main


def test_editable_install_console_script_trains_from_any_directory(tmp_path: Path) -> None:
    """``pip install -e .`` into a throwaway venv (the shared venv's packages via a .pth, nothing downloaded),
    then ``dlrm-train`` from an empty directory: it finds conf/ and writes its run dir from the job's name."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "shared.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    p = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "DLRM_RUN_NAME": "console", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run(
        [
            str(venv / "bin" / "dlrm-train"),
            "trainer.max_steps=4",
            "logger.log_every_n_steps=2",
            "eval.every_n_steps=null",
            "data.num_train_samples=4096",
            "data.num_val_samples=512",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    recs = [json.loads(line) for line in (work / "outputs" / "console" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "loss" in r] == [2, 4]
    assert [r["val_samples"] for r in recs if "val_auc" in r] == [512]
