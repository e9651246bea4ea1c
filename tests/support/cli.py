"""`spot-autoscaler run` as a child process, started the way a Deployment's container is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).with_name("spot-autoscaler")


def run_cli(
    tmp_path: Path,
    *args: str,
    identity: str = "cli",
    stdout: int | IO[str] = subprocess.PIPE,
    stderr: int | IO[str] = subprocess.PIPE,
    own_group: bool = False,
) -> subprocess.Popen[str]:
    """`run` on tmp_path's config.yaml and kubeconfig, plus ARGS, as pod IDENTITY ($POD_NAME:
    the replica's leader-election identity); `own_group`: in a process group of its own, as a
    terminal's foreground job (a signal to the group reaches its lease renewer too)."""
    return subprocess.Popen(
        [
            str(CLI),
            "run",
            "--config",
            str(tmp_path / "config.yaml"),
            "--kubeconfig",
            str(tmp_path / "kubeconfig"),
            *args,
        ],
        cwd=ROOT,
        env={**os.environ, "POD_NAME": identity},
        text=True,
        stdout=stdout,
        stderr=stderr,
        start_new_session=own_group,
    )


def stop_cli(proc: subprocess.Popen[str], timeout: float = 15.0) -> int:
    """SIGTERM a daemon (SIGCONT first: a paused one cannot handle it), SIGKILL it if it is not
    gone within `timeout` seconds; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
