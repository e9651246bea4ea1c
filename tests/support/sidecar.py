"""The launcher's discovery sidecar (`run_sidecar`) in a thread of the test, at a test's pace."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

from kubernetes.client import ApiClient

from autoscaler.adapters.discovery.sidecar import ContainerRef, JobRef, run_sidecar


def sidecar_thread(
    api: ApiClient,
    job: JobRef,
    drain_path: Path,
    stop: threading.Event,
    assigned_path: Path | None = None,
    exit_with: ContainerRef | None = None,
) -> threading.Thread:
    """A daemon thread (not started) running the sidecar until `stop` is set (or `exit_with`
    ended): the assigned-hosts file polled every 20 ms, API errors retried within 0.2 s."""
    return threading.Thread(
        target=run_sidecar,
        daemon=True,
        kwargs={
            "api": api,
            "job": job,
            "drain_path": drain_path,
            "assigned_path": assigned_path,
            "exit_with": exit_with,
            "watch_timeout": timedelta(seconds=30),
            "backoff_max": timedelta(seconds=0.2),
            "stop": stop,
            "poll": 0.02,
        },
    )
