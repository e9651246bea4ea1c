"""The architecture holds: a pure core, client libraries only in adapters, layers in order."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable
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
    """boto3 and the Alibaba SDKs are extras: the CLI (each command's module), the Kubernetes
    and standalone daemons, the node agent and the discovery sidecar must load without them."""
    code = (
        "import sys\n"
        "for sdk in ('boto3', 'botocore', 'aliyunsdkcore', 'aliyunsdkecs',"
        " 'alibabacloud_credentials'):\n"
        "    sys.modules[sdk] = None\n"
        "import importlib, autoscaler.daemon.wiring, autoscaler.adapters.kube\n"
        "from autoscaler.cli import COMMANDS\n"
        "for command in COMMANDS:\n"
        "    importlib.import_module(command.module)\n"
        "import autoscaler.adapters.standalone, autoscaler.programs.node_agent\n"
        "import autoscaler.programs.discovery_sidecar, autoscaler.sim.run\n"
    )
    _python(code)


def _python(code: str) -> str:
    """What `code` prints, run by a fresh interpreter from the repository's root."""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _loads_kubernetes(code: str) -> bool:
    """Whether running `code` in a fresh interpreter loads any module of the kubernetes SDK."""
    check = (
        "import sys\n"
        "print(any(m == 'kubernetes' or m.startswith('kubernetes.') for m in sys.modules))"
    )
    return _python(f"{code}\n{check}").strip() == "True"


def test_the_simulator_loads_no_kubernetes_module() -> None:
    """`simulate` needs no cluster: the SDK (~0.7 s to import) stays out (daemon/wiring.py)."""
    assert not _loads_kubernetes("import autoscaler.sim.run")
    assert not _loads_kubernetes(
        "from autoscaler.cli import build_parser\nbuild_parser(['simulate'])"
    )
    assert _loads_kubernetes("import autoscaler.adapters.kube.actuator")  # the check sees it


# --- import circles ------------------------------------------------------------------------------
# import-linter's layers say nothing about modules of one layer importing each other, and it
# skips imports under `if TYPE_CHECKING:`. A circle is a circle either way: the modules on it can
# only be understood, tested and changed together.


def _modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Every module of `package` under `root`: dotted name -> (file, is a package)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _imported(name: str, path: Path, is_package: bool, modules: Iterable[str]) -> set[str]:
    """The modules of the tree that `name` imports anywhere in its file (at the top, inside a
    function or under TYPE_CHECKING), relative imports resolved; `from pkg import mod` counts as
    an import of `pkg.mod` when that is a module."""
    known = set(modules)
    here = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
    resolved = set()
    for target in targets:
        while target and target not in known:  # `import a.b.C` or a name inside a module
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def import_cycles(root: Path, package: str) -> list[list[str]]:
    """Each import circle found by a depth-first walk, as [a, b, ..., a]."""
    modules = _modules(root, package)
    graph = {m: sorted(_imported(m, p, pkg, modules)) for m, (p, pkg) in modules.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in graph[module]:
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module)
    return cycles


def test_no_import_circle_inside_the_package() -> None:
    cycles = import_cycles(ROOT, "autoscaler")
    assert cycles == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_circle_check_sees_typing_only_and_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import b\n")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import A\n"
    )
    (package / "c.py").write_text("def f():\n    import pkg.a\n")
    assert import_cycles(tmp_path, "pkg") == [["pkg.a", "pkg.sub.b", "pkg.a"]]
