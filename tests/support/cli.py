"""`spot-autoscaler run` as a child process, started the way a Deployment's container is."""

from __future__ import annotations

import os
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
) -> subprocess.Popen[str]:
    """`run` on tmp_path's config.yaml and kubeconfig, plus ARGS, as pod IDENTITY ($POD_NAME:
    the replica's leader-election identity)."""
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
    )
