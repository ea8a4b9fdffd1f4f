"""Daemons the integration tests start and stop themselves: a Slurm cluster on this host, one slurmd per node, with
job accounting (munged, MariaDB, slurmdbd, slurmctld, slurmd) from Debian's packages, each in the foreground under
this process, with its configuration, state, sockets and logs in one directory and ports picked free at start.

Only what :class:`SlurmCluster` started is stopped, by its own process handle: jobs first (``scancel``, then
waiting until ``squeue`` is empty, so that no ``slurmstepd`` outlives ``slurmd``), then the daemons in reverse
order. :func:`needs_root_and_packages` installs what is missing with apt, or says why the suite cannot run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# Debian bookworm packages per tool the suite runs; installed when missing (root and apt's archive reachable)
PACKAGES: Dict[str, str] = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmdbd": "slurmdbd",
    "sbatch": "slurm-client",
    "mariadbd": "mariadb-server",
    "buildah": "buildah",
    "debootstrap": "debootstrap",
}
SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


def which(tool: str) -> Optional[str]:
    return shutil.which(tool, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))


def needs_root_and_packages(tools: Sequence[str]) -> Optional[str]:
    """Install the Debian packages of ``tools`` that are missing; return why the suite cannot run, or None.

    apt's output goes to the caller's stdout only on failure (it is long); ``apt-get update`` runs first, once.
    """
    missing = sorted({PACKAGES[t] for t in tools if which(t) is None})
    if not missing:
        return None
    if os.geteuid() != 0:
        return f"needs root to install {' '.join(missing)} (Debian packages); run as root or install them first"
    if which("apt-get") is None:
        return f"needs the Debian packages {' '.join(missing)} and apt-get is not here to install them"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
            return f"`{' '.join(cmd)}` failed (no package archive reachable?): {' | '.join(tail)}"
    still = [t for t in tools if which(t) is None]
    return f"installed {' '.join(missing)} but {' '.join(still)} is still missing" if still else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}:\n{_tail(log)}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f} s:\n{_tail(log)}")


def _tail(log: Path, n: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"


class SlurmCluster:
    """A Slurm 22.05 cluster of ``nodes`` nodes on this host with slurmdbd accounting (what torchx's ``describe``
    and ``status`` read through ``sacct``), rooted at ``root``.

    ``env`` is the environment for Slurm's client commands (``sbatch``, ``sacct``, ``torchx``): ``SLURM_CONF``
    names this cluster's slurm.conf, so the host's own /etc/slurm is neither read nor written.
    """

    def __init__(
        self,
        root: Path,
        nodes: int = 1,
        cluster_name: str = "dlrmtest",
        kill_wait_s: int = 30,
        cred_expire_s: int = 10,
    ) -> None:
        self.root = root
        self.name = cluster_name
        self.kill_wait_s = kill_wait_s
        self.cred_expire_s = cred_expire_s
        self.procs: List[tuple] = []  # (name, Popen, log path), in start order
        self.host = socket.gethostname()
        # One slurmd per node on this host (Debian builds Slurm with multiple-slurmd support). The first node is
        # named after the host: torchx's rendezvous endpoint is the first het-job group's node name, which must
        # resolve, and a higher Weight on the others makes the scheduler place that group there.
        self.nodes = [self.host] + [f"{self.host}-n{i}" for i in range(2, nodes + 1)]
        self.conf = root / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------------------------------------ start
    def start(self) -> "SlurmCluster":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, cmd: List[str], log: Path, user: Optional[str] = None) -> subprocess.Popen:
        out = open(log.with_suffix(".stdout"), "wb")
        # own session: a Ctrl-C to pytest's process group reaches the daemons only through stop()
        proc = subprocess.Popen(
            cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, user=user, start_new_session=True
        )
        out.close()
        self.procs.append((name, proc, log))
        return proc

    def _start(self) -> None:
        r = self.root
        r.chmod(0o755)  # munge and mysql users reach their directories through it
        for d in ("etc", "log", "state", "spool", "run", "munge", "db"):
            (r / d).mkdir(parents=True, exist_ok=True)
        ports = {k: free_port() for k in ("ctld", "dbd", "mysql", *self.nodes)}
        munge_sock = r / "munge" / "munge.socket.2"

        # munged, as the munge user (it refuses root) with its own key, socket and state
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        subprocess.run(["chown", "-R", "munge:munge", str(r / "munge")], check=True)
        (r / "munge").chmod(0o700)
        munged = self._spawn(
            "munged",
            [
                which("munged"),
                "--foreground",
                "--force",
                f"--socket={munge_sock}",
                f"--key-file={key}",
                f"--pid-file={r / 'munge' / 'munged.pid'}",
                f"--seed-file={r / 'munge' / 'munged.seed'}",
                f"--log-file={r / 'munge' / 'munged.log'}",
            ],  # fmt: skip
            r / "log" / "munged.log",
            user="munge",
        )
        end = time.monotonic() + 30
        while not munge_sock.exists():
            if munged.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"munged did not start:\n{_tail(r / 'log' / 'munged.stdout')}")
            time.sleep(0.1)

        # MariaDB for slurmdbd: a fresh data directory, TCP on loopback only, no grant tables (nothing but
        # this cluster's slurmdbd can reach it, and it needs no password)
        db = r / "db"
        subprocess.run(["chown", "mysql:mysql", str(db)], check=True)
        p = subprocess.run(
            [
                which("mariadb-install-db") or "mysql_install_db",
                "--no-defaults",
                f"--datadir={db}",
                "--user=mysql",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=300,
        )
        if p.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed:\n{p.stdout}{p.stderr}")
        mysql = self._spawn(
            "mariadbd",
            [which("mariadbd"), "--no-defaults", f"--datadir={db}", "--user=mysql", f"--port={ports['mysql']}",
             "--bind-address=127.0.0.1", f"--socket={db / 'mysqld.sock'}", f"--pid-file={db / 'mysqld.pid'}",
             "--skip-grant-tables", "--innodb-buffer-pool-size=64M", f"--log-error={r / 'log' / 'mariadbd.log'}"],
            r / "log" / "mariadbd.log",
        )  # fmt: skip
        _wait_port(ports["mysql"], mysql, "mariadbd", r / "log" / "mariadbd.log")

        auth = f"AuthType=auth/munge\nAuthInfo=socket={munge_sock}\n"
        # a requeued job waits cred_expire + 1 s before it may start again (120 s by default)
        ctld_auth = f"AuthType=auth/munge\nAuthInfo=cred_expire={self.cred_expire_s},socket={munge_sock}\n"
        dbd_conf = r / "etc" / "slurmdbd.conf"
        dbd_conf.write_text(
            f"{auth}DbdHost=localhost\nDbdAddr=127.0.0.1\nDbdPort={ports['dbd']}\nSlurmUser=root\n"
            f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={ports['mysql']}\n"
            f"StorageUser=root\nStorageLoc=slurm_acct_db\nPidFile={r / 'run' / 'slurmdbd.pid'}\n"
            f"LogFile={r / 'log' / 'slurmdbd.log'}\n"
        )
        dbd_conf.chmod(0o600)
        cpus, mem = self._node_resources()
        self.conf.write_text(
            f"ClusterName={self.name}\nSlurmctldHost={self.host}(127.0.0.1)\nSlurmUser=root\nSlurmdUser=root\n"
            f"SlurmctldPort={ports['ctld']}\n{ctld_auth}CredType=cred/munge\n"
            f"StateSaveLocation={r / 'state'}\nSlurmdSpoolDir={r / 'spool' / '%n'}\n"
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}\nSlurmdPidFile={r / 'run' / 'slurmd-%n.pid'}\n"
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}\nSlurmdLogFile={r / 'log' / 'slurmd-%n.log'}\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\nReturnToService=2\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/slurmdbd\n"
            f"AccountingStorageHost=localhost\nAccountingStoragePort={ports['dbd']}\n"
            # for slurmdbd this is the munge socket to sign requests with (the default one is the host's)
            f"AccountingStoragePass={munge_sock}\nMailProg=/bin/true\n"
            # a job that becomes eligible (requeued, after cred_expire) starts in a second, not sched_interval's 60
            f"KillWait={self.kill_wait_s}\nSchedulerParameters=sched_interval=1,bf_interval=1\nMinJobAge=600\n"
            + "".join(
                f"NodeName={n} NodeHostname={n} NodeAddr=127.0.0.1 Port={ports[n]} CPUs={cpus} "
                f"RealMemory={mem // len(self.nodes)} Weight={i + 1} State=UNKNOWN\n"
                for i, n in enumerate(self.nodes)
            )
            + "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )
        dbd = self._spawn("slurmdbd", [which("slurmdbd"), "-D"], r / "log" / "slurmdbd.log")
        _wait_port(ports["dbd"], dbd, "slurmdbd", r / "log" / "slurmdbd.log")
        ctld = self._spawn("slurmctld", [which("slurmctld"), "-D", "-i"], r / "log" / "slurmctld.log")
        _wait_port(ports["ctld"], ctld, "slurmctld", r / "log" / "slurmctld.log")
        for n in self.nodes:
            (r / "spool" / n).mkdir()
            self._spawn(f"slurmd {n}", [which("slurmd"), "-D", "-N", n], r / "log" / f"slurmd-{n}.log")
        self._wait_idle()

    def _node_resources(self) -> tuple:
        out = subprocess.run([which("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
        fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
        return int(fields["CPUs"]), int(fields["RealMemory"]) - 1024  # leave the host a little

    def _wait_idle(self, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        state = ""
        while time.monotonic() < end:
            for name, proc, log in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with status {proc.returncode}:\n{_tail(log)}")
            state = self.run(["sinfo", "-h", "-o", "%T %D"], check=False).stdout.strip()
            if state == f"idle {len(self.nodes)}":
                return
            time.sleep(0.5)
        log = _tail(self.root / "log" / f"slurmd-{self.nodes[-1]}.log")
        raise RuntimeError(f"nodes not idle within {timeout:.0f} s (sinfo: {state!r}):\n{log}")

    # --------------------------------------------------------------------------------------------- clients
    def run(self, cmd: List[str], check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: status {p.returncode}\n{p.stdout}{p.stderr}")
        return p

    def sacct(self, job_id: str, fields: str = "JobID,JobName,State,ExitCode,Restarts", *extra: str) -> List[Dict]:
        out = self.run(["sacct", "-n", "-P", "-j", job_id, "-o", fields, *extra]).stdout
        names = fields.split(",")
        return [dict(zip(names, line.split("|"))) for line in out.splitlines() if line]

    def wait_job(self, job_id: str, states: Sequence[str], timeout: float) -> Dict[str, str]:
        """Poll ``scontrol show job`` until the job's state is one of ``states``; return its fields."""
        end = time.monotonic() + timeout
        fields: Dict[str, str] = {}
        while time.monotonic() < end:
            p = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
            fields = dict(kv.split("=", 1) for kv in p.stdout.split() if "=" in kv)
            if fields.get("JobState") in states:
                return fields
            time.sleep(1)
        raise TimeoutError(f"job {job_id} not in {states} within {timeout:.0f} s: {fields.get('JobState')}")

    def log(self, name: str) -> str:
        return _tail(self.root / "log" / f"{name}.log", 40)

    # ------------------------------------------------------------------------------------------------- stop
    def stop(self) -> None:
        """Cancel every job, wait for their steps to end, then stop the daemons this object started."""
        if any(n == "slurmctld" and p.poll() is None for n, p, _ in self.procs):
            self.run(["scancel", "--full", "-u", "root"], check=False)
            end = time.monotonic() + self.kill_wait_s + 30
            while time.monotonic() < end:
                if not self.run(["squeue", "-h"], check=False).stdout.strip():
                    break
                time.sleep(0.5)
        for _name, proc, _log in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)
        self.procs.clear()
