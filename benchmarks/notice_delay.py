"""How long from a spot notice being published to the decision that drains its node?

Publishes N interruption warnings one after another through EventBridge (`put_events`, with a rule
targeting the SQS queue, as AWS delivers them) or straight into the queue (`--via send_message`),
to a moto server running in its own process (as AWS would be). The production consumer
(`SqsNoticeSource.run`, 20 s long poll) posts each notice to the board and calls `wake`; a harness
thread runs `decide` on every wake and notes when a DRAIN names the noticed node.

    .venv/bin/python benchmarks/notice_delay.py [-n 50] [--via put_events|send_message]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime

import boto3

from autoscaler.adapters.aws.clients import aws_clients
from autoscaler.adapters.aws.nodes import Ec2Nodes
from autoscaler.adapters.aws.queue import SqsNoticeSource
from autoscaler.config.cloud import AwsSettings
from autoscaler.core import Action, GpuNode, Job, PolicySet, Snapshot, Worker, decide
from autoscaler.logs import configure
from autoscaler.notices_and_prices import NoticeBoard

REGION = "us-east-1"
ITN = "EC2 Spot Instance Interruption Warning"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    binary = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or "moto_server"
    server = subprocess.Popen(
        [binary, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            return server, url
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise SystemExit("moto_server did not start") from None
            time.sleep(0.1)


class Index:
    def __init__(self, known: dict[str, str]) -> None:
        self.known = known

    def node_for_instance(self, instance_id: str) -> str | None:
        return self.known.get(instance_id)


class Harness:
    """The daemon's reconcile loop in miniature: on each wake, decide; note first drains."""

    def __init__(self, board: NoticeBoard, nodes: list[str]) -> None:
        self.board = board
        self.gpus = tuple(GpuNode(n, 1, 1) for n in [*nodes, "safe"])
        workers = tuple(Worker(f"w-{i}", n, f"w-{i}", i) for i, n in enumerate([*nodes, "safe"]))
        self.job = Job("ml", "bert", 1, len(workers), workers=workers)
        self.policies = PolicySet()
        self.drained_at: dict[str, float] = {}
        self.seen = threading.Condition()
        self._woken = threading.Event()

    def wake(self, why: str) -> None:
        self._woken.set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self._woken.wait(0.1):
                continue
            self._woken.clear()
            now = datetime.now(UTC)
            snapshot = Snapshot(nodes=self.gpus, notices=self.board.active(now), jobs=(self.job,))
            for d in decide(snapshot, self.policies, now):
                if d.action is Action.DRAIN:
                    stamp = time.perf_counter()
                    with self.seen:
                        for node in d.nodes:
                            self.drained_at.setdefault(node, stamp)
                        self.seen.notify_all()

    def wait_drained(self, node: str, timeout: float) -> float:
        with self.seen:
            if not self.seen.wait_for(lambda: node in self.drained_at, timeout):
                raise SystemExit(f"no drain decision for {node} within {timeout} s")
            return self.drained_at[node]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50, help="notices to publish (default 50)")
    parser.add_argument("--via", choices=["put_events", "send_message"], default="put_events")
    args = parser.parse_args()
    configure(level="warning")
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": REGION,
        }
    )
    server, url = start_moto()
    stop = threading.Event()
    try:
        settings = AwsSettings(region=REGION)  # production long poll: 20 s, 10 messages
        sqs, ec2 = aws_clients(settings, url)
        events = boto3.client("events", region_name=REGION, endpoint_url=url)
        queue = sqs.create_queue(QueueName="spot-notices")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]
        events.put_rule(
            Name="spot-notices",
            EventPattern=json.dumps({"source": ["aws.ec2"], "detail-type": [ITN]}),
        )
        events.put_targets(Rule="spot-notices", Targets=[{"Id": "q", "Arn": arn["QueueArn"]}])

        instances = {f"i-{n:017x}": f"gpu-{n}" for n in range(args.n)}
        board = NoticeBoard()
        harness = Harness(board, list(instances.values()))
        source = SqsNoticeSource(
            sqs,
            queue,
            board,
            harness.wake,
            Ec2Nodes(ec2, Index(instances)),
            wait_time=settings.wait_time,
        )
        threads = [
            threading.Thread(target=t, args=(stop,), daemon=True) for t in (source.run, harness.run)
        ]
        for t in threads:
            t.start()

        delays = []
        for instance, node in instances.items():
            detail = json.dumps({"instance-id": instance, "instance-action": "terminate"})
            sent = time.perf_counter()
            if args.via == "put_events":
                entry = {"Source": "aws.ec2", "DetailType": ITN, "Detail": detail}
                events.put_events(Entries=[entry])
            else:
                sqs.send_message(
                    QueueUrl=queue,
                    MessageBody=json.dumps(
                        {
                            "version": "0",
                            "id": f"bench-{instance}",
                            "detail-type": ITN,
                            "source": "aws.ec2",
                            "account": "123456789012",
                            "region": REGION,
                            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "resources": [],
                            "detail": json.loads(detail),
                        }
                    ),
                )
            delays.append(harness.wait_drained(node, timeout=30) - sent)
        deadline = time.monotonic() + 10  # the last batch is deleted right after its decision
        while source.counts["deleted"] < len(instances) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        server.terminate()
        server.wait(10)

    ms = sorted(d * 1000 for d in delays)
    print(
        f"notice -> drain decision via {args.via}, moto in its own process, "
        f"20 s long poll, over {len(ms)} notices:"
    )
    print(
        f"  median {statistics.median(ms):.1f} ms   p90 {ms[int(0.9 * (len(ms) - 1))]:.1f} ms"
        f"   max {ms[-1]:.1f} ms   min {ms[0]:.1f} ms"
    )
    print(f"  consumer counts: {dict(source.counts)}")


if __name__ == "__main__":
    main()
