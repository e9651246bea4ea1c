"""`daemon.mode: standalone` through the same daemon: a notice file makes a host leave discovery."""

from __future__ import annotations

import time
from pathlib import Path

from support.waiting import wait_for
from test_daemon_support import http_get, metric, wired_daemon

from autoscaler.config import Config, parse_config
from autoscaler.daemon.leader import AlwaysLeader


def standalone(tmp_path: Path, hosts: str, max_workers: int) -> Config:
    """A standalone daemon over `hosts` (YAML), its discovery file and notice directory in
    `tmp_path`; a 30 s tick, so what happens sooner was woken by a notice."""
    return parse_config(f"""
policies: [{{name: default, scale_out: {{min_idle: 0s, cooldown: 0s}}}}]
daemon: {{mode: standalone, tick_interval: 30s, wake_coalesce: 0.02s, metrics_port: 0,
          metrics_bind_address: 127.0.0.1}}
standalone:
  hosts: {hosts}
  job: {{name: bert, min_workers: 1, max_workers: {max_workers}}}
  discovery_file: {tmp_path / "hosts"}
  notice_dir: {tmp_path / "notices"}
  notice_poll: 0.05s
""")


def test_a_notice_file_drains_its_host_from_the_discovery_file(tmp_path: Path) -> None:
    (tmp_path / "notices").mkdir()
    hosts = tmp_path / "hosts"
    cfg = standalone(tmp_path, "[{name: host-a, slots: 2}, {name: host-b, slots: 2}]", 4)
    d, _ = wired_daemon(cfg, None)
    assert d.parts.lock is None  # one process owns the file: no Lease, no API server
    assert isinstance(d.leadership, AlwaysLeader)
    d.start()
    try:
        wait_for(
            lambda: hosts.exists() and hosts.read_text().split() == ["host-a:2", "host-b:2"],
            what="the first pass to fill the discovery file",
        )
        (tmp_path / "notices" / "host-a.json").write_text('{"kind": "interruption", "id": "i-1"}')
        noticed = time.monotonic()
        wait_for(lambda: "host-a" not in hosts.read_text(), what="host-a to leave discovery")
        assert time.monotonic() - noticed < 1.5  # poll 0.05 s + one pass; the tick is 30 s
        assert hosts.read_text().split() == ["host-b:2"]

        def metrics() -> str:
            return http_get(d.endpoints.port, "/metrics")[1]  # type: ignore[union-attr]

        # the latency is observed once the pass has acted, after the file was written
        wait_for(
            lambda: (metric(metrics(), "spot_autoscaler_reaction_latency_seconds_count") or 0) >= 1,
            what="the notice's reaction latency to be observed",
        )
        text = metrics()
        assert (
            metric(text, "spot_autoscaler_notices_total", source="notice-dir", kind="interruption")
            == 1
        )
        assert metric(text, "spot_autoscaler_reaction_latency_seconds_count") == 1
        assert http_get(d.endpoints.port, "/readyz")[0] == 200  # type: ignore[union-attr]
    finally:
        d.stop()


def test_a_noticed_hosts_replacement_joins_right_after_its_drain(tmp_path: Path) -> None:
    """The notice takes the fast path (drain), then the full pass refills at once: Horovod's next
    discovery call sees the drain and the replacement together, not a tick (30 s) apart."""
    (tmp_path / "notices").mkdir()
    (tmp_path / "notices" / "host-c.json").write_text("")  # not up yet
    hosts = tmp_path / "hosts"
    cfg = standalone(tmp_path, "[{name: host-a}, {name: host-b}, {name: host-c}]", 2)
    d, _ = wired_daemon(cfg, None)
    d.start()
    try:
        wait_for(
            lambda: hosts.exists() and hosts.read_text().split() == ["host-a:1", "host-b:1"],
            what="the first pass to fill the discovery file",
        )
        # host-a's notice and host-c's arrival in one scan, as a spot replacement comes up
        (tmp_path / "notices" / "host-a.json").write_text('{"kind": "interruption"}')
        (tmp_path / "notices" / "host-c.json").unlink()
        noticed = time.monotonic()
        wait_for(
            lambda: hosts.read_text().split() == ["host-b:1", "host-c:1"],
            what="host-a drained and host-c added",
        )
        assert time.monotonic() - noticed < 1.5  # poll 0.05 s + the fast path + one pass
    finally:
        d.stop()
