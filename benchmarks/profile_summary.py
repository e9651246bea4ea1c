"""Where a py-spy profile of the daemon spends its time (`reaction.py --py-spy FILE`: raw
collapsed stacks, every thread, idle ones too, sampled at py-spy's 100 Hz).

    .venv/bin/python benchmarks/profile_summary.py FILE          # every thread, then the pass
    .venv/bin/python benchmarks/profile_summary.py FILE --depth 4 --top 30

Each sample is put in one of four states by its innermost frame: `network` (blocked reading a
socket: the API server's or SQS's answer), `blocked` (waiting on a condition or a future inside
a pass or the fast path: for the writes it handed to other threads), `idle` (waiting for work:
a condition, an event, an executor's queue, a selector) or `running` (anything else: on a core,
or waiting for one or for the GIL; on a saturated machine that wait is part of it). Then:

- per thread (executor threads of one pool together): samples and the share in each state;
- for one thread (`--thread`, default the reconcile loop's), the tree of what it did below
  `--under` (default `ReconcileLoop._run`) to `--depth` levels, each node with its share of the
  thread's samples and its running / network split (branches under 1% left out);
- that thread's functions by running samples spent in their own code (`--top`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

# innermost Python frames of a thread that waits for work, and of one blocked on a socket
IDLE = {
    "Condition.wait",
    "Event.wait",
    "_worker",  # concurrent.futures: an executor's thread waiting on its queue
    "_PollLikeSelector.select",
    "EpollSelector.select",
    "select",
    "sleep",
    "Thread._wait_for_tstate_lock",
    "Thread.join",
    "WakeSignal.wait",
}
NETWORK = {
    "SSLSocket.read",
    "SSLSocket.recv_into",
    "SocketIO.readinto",
    "socket.recv_into",
    "SSLSocket.do_handshake",
    "create_connection",
}
# a wait below one of these is the work's own (its writes, handed to other threads)
WORK = {"Reconciler.tick", "Reconciler.react"}
STATES = ("running", "network", "blocked", "idle")


def samples(path: Path) -> Iterator[tuple[str, list[str], int]]:
    """(thread, frames outermost first, count) of each line; executor threads named by pool."""
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        _, _, rest = stack.partition(": ")  # "thread (tid): name;frame;frame"
        frames = rest.split(";")
        thread = re.sub(r"_\d+$", "", frames[0])
        yield thread, [f.split(" (")[0] for f in frames[1:]], int(count)


def state(frames: list[str]) -> str:
    leaf = frames[-1] if frames else ""
    if leaf in IDLE:
        return "blocked" if WORK.intersection(frames) else "idle"
    if leaf in NETWORK:
        return "network"
    return "running"


def threads(rows: Iterable[tuple[str, list[str], int]]) -> str:
    per: dict[str, Counter[str]] = defaultdict(Counter)
    for thread, frames, n in rows:
        per[thread][state(frames)] += n
    out = ["thread: samples, running / network / blocked / idle"]
    for thread, c in sorted(per.items(), key=lambda kv: kv[1]["idle"] - sum(kv[1].values())):
        total = sum(c.values())
        shares = " / ".join(f"{100 * c[s] / total:.1f}%" for s in STATES)
        out.append(f"  {thread}: {total}, {shares}")
    return "\n".join(out)


def tree(rows: list[tuple[str, list[str], int]], thread: str, under: str, depth: int) -> str:
    mine = [(f, n) for t, f, n in rows if t == thread]
    total = sum(n for _, n in mine)
    if not total:
        return f"no samples of thread {thread!r}"
    nodes: dict[tuple[str, ...], Counter[str]] = defaultdict(Counter)
    outside: Counter[str] = Counter()
    for frames, n in mine:
        s = state(frames)
        if under in frames:
            below = frames[frames.index(under) + 1 :]
            for d in range(1, min(depth, len(below)) + 1):
                nodes[tuple(below[:d])][s] += n
        else:
            outside[s] += n

    def label(c: Counter[str]) -> str:
        n = sum(c.values())
        if c["idle"] >= 0.99 * n:
            return f"{100 * n / total:.1f}% (idle)"
        split = ", ".join(f"{s} {100 * c[s] / total:.1f}%" for s in STATES[:3] if c[s])
        return f"{100 * n / total:.1f}% ({split})"

    out = [f"thread {thread}: {total} samples ({total / 100:.0f} s at 100 Hz), below {under}:"]

    def walk(prefix: tuple[str, ...]) -> None:
        children = [k for k in nodes if len(k) == len(prefix) + 1 and k[: len(prefix)] == prefix]
        for key in sorted(children, key=lambda k: -sum(nodes[k].values())):
            if sum(nodes[key].values()) < total / 100:
                continue
            out.append(f"{'  ' * len(key)}{key[-1]}: {label(nodes[key])}")
            walk(key)

    walk(())
    if outside:
        out.append(f"  (not below {under}: {label(outside)})")
    return "\n".join(out)


def top(rows: list[tuple[str, list[str], int]], thread: str, n: int) -> str:
    own: Counter[str] = Counter()
    total = 0
    for t, frames, count in rows:
        if t != thread:
            continue
        total += count
        if frames and state(frames) == "running":
            own[frames[-1]] += count
    out = [f"thread {thread}: running samples by the function whose own code ran"]
    for func, count in own.most_common(n):
        out.append(f"  {100 * count / max(total, 1):5.1f}%  {func}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--thread", default="reconcile")
    parser.add_argument("--under", default="ReconcileLoop._run")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    rows = list(samples(args.profile))
    print(threads(rows))
    print()
    print(tree(rows, args.thread, args.under, args.depth))
    print()
    print(top(rows, args.thread, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
