"""Which adapters make up each mode: the ONE place that knows the other packages' class names.

kubernetes: watch caches feed the observer, the actuator writes ScaleOut/ScaleIn objects and
AITrainingJob patches, a Lease elects the one replica that acts, cloud sources post notices
(persisted on their Nodes) and spot prices.
standalone: a fixed host list and the Horovod discovery file, one process, no API server.

Adapters are imported inside the mode that needs them: `spot-autoscaler simulate` and a
standalone daemon never load the Kubernetes or cloud SDKs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autoscaler.adapters.sources import SourceContext, build_sources
from autoscaler.config import Config
from autoscaler.daemon.persist import PersistingBoard
from autoscaler.daemon.service import Parts
from autoscaler.fencing import Fence
from autoscaler.notices_and_prices import NoticeBoard, PriceBook, Wake

OnError = Callable[[str], None]  # counts a survived failure by component
_WRITE_WORKERS = 8  # concurrent writes of different jobs in a pass, an action at a time
_EVENTS_FLUSH = 3.0  # seconds queued Events get at shutdown (inside the pod's grace period)


def build_parts(
    config: Config,
    wake: Wake,
    logger: Any,
    on_error: OnError,
    *,
    kubeconfig: Path | None,
    dry_run: bool,
) -> Parts:
    if config.daemon.mode == "standalone":
        return _standalone(config, wake, dry_run)
    return _kubernetes(config, wake, logger, on_error, kubeconfig, dry_run)


def identity(configured: str | None) -> str:
    """Who holds the Lease: unique per process (two daemons on one host must differ)."""
    return configured or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _kubernetes(
    config: Config,
    wake: Wake,
    logger: Any,
    on_error: OnError,
    kubeconfig: Path | None,
    dry_run: bool,
) -> Parts:
    from autoscaler.adapters.kube import (
        DryRunActuator,
        EventRecorder,
        KubeActuator,
        KubeCache,
        KubeObserver,
    )
    from autoscaler.adapters.kube.client import api_client, own_namespace, unreachable
    from autoscaler.adapters.kube.kinds import WATCHLIST
    from autoscaler.adapters.kube.lease import LeaseRecipe
    from autoscaler.adapters.kube.rejects import Rejections

    election = config.daemon.leader_election
    me = identity(election.identity)
    api = api_client(kubeconfig, identity=me)
    cache = KubeCache(api, config.kubernetes, WATCHLIST, wake)
    rejections = Rejections()
    # Every write asks this fence first; the daemon binds it to the elector (always open without
    # leader election). A write sent while the lease is valid (renewed < renew_deadline ago) and
    # bounded by lease_duration - renew_deadline ends before another replica may take over.
    fence = Fence(
        (election.lease_duration - election.renew_deadline).total_seconds()
        if election.enabled
        else None
    )
    recorder = EventRecorder(api, host=me, fence=fence)
    actuator = (
        DryRunActuator()
        if dry_run
        # the board is made after the actuator (it persists notices through it): read late
        else KubeActuator(
            api, config, recorder, cache, rejections, fence, lambda now: board.active(now)
        )
    )
    board = PersistingBoard(actuator.persist_notice, logger, lambda: on_error("notices"))
    prices = PriceBook()
    sources = build_sources(config, SourceContext(board, prices, wake, cache, cache.instance_types))
    lock = LeaseRecipe(  # made where the renewals run: in a process of their own by default
        None if kubeconfig is None else str(kubeconfig),
        election.lease_namespace or own_namespace(),
        election.lease_name,
        me,
        election.lease_duration,
        request_timeout=election.renew_deadline.total_seconds() / 2,  # two tries fit in a deadline
    )
    observer = KubeObserver(cache, config.kubernetes, config.prices, board, prices, rejections)
    return Parts(
        observer=observer,
        reconfigure=lambda new: observer.set_prices(new.prices),
        actuator=actuator,
        synced=cache.synced,
        backends=cache.backends,
        rejected=rejections.counts,
        start=cache.start,
        stop=lambda: _stop_all(board.close, cache.stop),
        # before the Lease goes: queued pod signals dropped (counted), queued Events sent for
        # a while, then dropped (counted)
        settle=lambda: _stop_all(actuator.stop_signals, lambda: recorder.close(_EVENTS_FLUSH)),
        write_workers=_WRITE_WORKERS,
        announce=lambda reason, message: recorder.about_self(reason, message, _now()),
        sources=sources,
        lock=lock,
        fence=fence,
        watch_errors=cache.errors,
        signal_failures=lambda: actuator.signal_failures,
        reachable=lambda within: unreachable(api, within),
    )


def _standalone(config: Config, wake: Wake, dry_run: bool) -> Parts:
    from autoscaler.adapters.standalone import OwnedDiscoveryActuator, StandaloneObserver

    # Notices come from the notice directory (the node agent or a cloud hook writes files there);
    # no cloud source posts here: without a cluster there is no instance -> host index.
    observer = StandaloneObserver(config.standalone, NoticeBoard(), wake)
    return Parts(
        observer=observer,
        actuator=OwnedDiscoveryActuator(config.standalone, dry_run=dry_run),
        synced=observer.synced,
        start=observer.start,
        stop=observer.stop,
    )


def _now() -> datetime:
    return datetime.now(UTC)


def _stop_all(*steps: Callable[[], object]) -> None:
    for step in steps:
        step()
