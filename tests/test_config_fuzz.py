"""Any file, however broken, gets problems with file:line, never a traceback nor a stall: mutated
copies of the shipped example (bytes flipped, lines dropped or repeated, YAML oddities spliced in:
alias bombs, deep nesting, control characters, explicit tags on bad values)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from autoscaler.config import ConfigError, check_config

EXAMPLE = Path(__file__).resolve().parents[1] / "config" / "example.yaml"
# 400 files in `make test`; `make chaos` runs 10,000 (CONFIG_FUZZ_FILES)
PER_SEED = int(os.environ.get("CONFIG_FUZZ_FILES", "400")) // 4
ODDITIES = [
    b"a: &x [*x]\n",
    b"? [a, b]\n: 1\n",
    b"x: !!python/object:os.system y\n",
    b"policies: " + b"[" * 3000 + b"]" * 3000 + b"\n",
    b"\xff\xfe\x00",
    b"cooldown: 99999999999999999999d\n",
    b"policies: {name: [1, 2]}\n",
    b"- - - -\n",
    b"limits: {min_workers: 1e400}\n",
    b"default_policy: .nan\n",
    b"prices: !!binary aGk=\n",
    # an alias bomb: a million values from a few hundred bytes
    b"a0: &a0 lol\n"
    + b"".join(
        b"a%d: &a%d [" % (i, i) + b", ".join([b"*a%d" % (i - 1)] * 10) + b"]\n" for i in range(1, 7)
    ),
    b"x: " + b"{y: " * 80 + b"1" + b"}" * 80 + b"\n",  # nested deeper than the composer allows
    b"".join(b"  " * i + b"k:\n" for i in range(70)),
    b"name: a\x02b\n",  # control characters the reader refuses
    b"cooldown: \x1b[0m\n",
    b"min_workers: !!int x\n",  # explicit tags on values they cannot be
    b"enabled: !!bool maybe\n",
    b"at: !!timestamp 2020-13-45\n",
    b"max_price_per_gpu_hour: !!float cheap\n",
]


def mutate(rng: random.Random, text: bytes) -> bytes:
    lines = text.splitlines(keepends=True)
    for _ in range(rng.randint(1, 4)):
        what = rng.randrange(4)
        i = rng.randrange(len(lines))
        if what == 0:
            line = bytearray(lines[i] or b" ")
            line[rng.randrange(len(line))] = rng.randrange(256)
            lines[i] = bytes(line)
        elif what == 1:
            del lines[i]
        elif what == 2:
            lines.insert(i, lines[rng.randrange(len(lines))])
        else:
            lines.insert(i, rng.choice(ODDITIES))
    return b"".join(lines)


@pytest.mark.parametrize("seed", range(4))
def test_mutated_configs_give_problems_never_tracebacks(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    text = EXAMPLE.read_bytes()
    bad = 0
    for n in range(PER_SEED):
        path = tmp_path / f"c{n}.yaml"
        path.write_bytes(mutate(rng, text))
        try:
            check_config(path)
        except ConfigError as exc:
            bad += 1
            assert exc.problems and all(
                str(p).startswith(f"{path}:{p.line}:") for p in exc.problems
            )
            assert all(p.line for p in exc.problems), exc.problems  # every problem has its line
    assert bad > 10  # not vacuous: many mutants are broken


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\xff\xfe\x00bad", ":1: <top>: not UTF-8 text (byte 0xff)"),
        (b"a: &x [*x]\n", ":1: a[0]: an alias that contains itself"),
        (b"? [a, b]\n: 1\n", ":1: <top>: a key must be a plain value"),
        (b"policies: !!python/object:os.system x\n", "policies: bad YAML: could not determine"),
        (
            b"policies:\n  - name: d\n    scale_out: {cooldown: 99999999999999999999d}\n",
            ":3: policies[0].scale_out.cooldown: duration out of range",
        ),
        (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", ":1: <top>: bad YAML: nested deeper than 64"),
        (
            b"a: 1\nx: " + b"{y: " * 80 + b"1" + b"}" * 80,
            ":2: <top>: bad YAML: nested deeper than 64",
        ),
        (b"a: 1\nb: x\x02\n", ":2: <top>: bad YAML: unacceptable character #x0002"),
        (b"a: 1\nb: !!int x\n", ":2: b: bad YAML: 'x' is not a valid !!int"),
        (ODDITIES[11], ":6: <top>: bad YAML: more than 50,000 values with its aliases expanded"),
    ],
)
def test_each_kind_of_broken_file_gets_one_clear_line(
    tmp_path: Path, content: bytes, says: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as exc:
        check_config(path)
    assert any(says in str(p) for p in exc.value.problems), exc.value.problems
