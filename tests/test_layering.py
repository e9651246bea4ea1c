"""The architecture holds: a pure core, client libraries only in adapters, layers in order."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_core_never_reads_the_clock_or_files() -> None:
    # import-linter cannot see `datetime.now()`: the core must be handed `now`
    banned = re.compile(r"\b(?:datetime\.now|datetime\.utcnow|date\.today|open)\(")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "autoscaler" / "core").glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if banned.search(line)
    ]
    assert offenders == []


def test_without_the_cloud_extras_everything_but_the_cloud_sources_imports() -> None:
    """boto3 and the Alibaba SDKs are extras: the CLI, the Kubernetes and standalone daemons,
    the node agent and the discovery sidecar must load without them."""
    code = (
        "import sys\n"
        "for sdk in ('boto3', 'botocore', 'aliyunsdkcore', 'aliyunsdkecs',"
        " 'alibabacloud_credentials'):\n"
        "    sys.modules[sdk] = None\n"
        "import autoscaler.cli, autoscaler.daemon.wiring, autoscaler.adapters.kube\n"
        "import autoscaler.adapters.standalone, autoscaler.programs.node_agent\n"
        "import autoscaler.programs.discovery_sidecar, autoscaler.sim.run\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
