"""Reading a launch script takes time linear in its size, whatever bytes it holds (issue 24, item 4).

tree-sitter-bash's parse is quadratic on NUL bytes (25 KB took 5 s, 200 KB over 300 s) and, through its error
recovery, on long malformed runs (`)a)a...`, `a|a|...|`). The reader removes control characters first and gives
tree-sitter an allowance of CPU time linear in the bytes read; these tests time the whole reading (CPU time, so
that a loaded machine does not fail them) at a size and at 4 times it.
"""

import re
import time

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nanscope.errors import UserError
from nanscope.launch.script import parse_script

TRAIN = b"python3 train.py --colocate --rollout-batch-size 1 --num-layers 4\n"
SMALL = 4096  # bytes; the larger script is 4 times as long
SLACK = 0.3  # CPU seconds: the reader's constant allowance (launch.script.bounds.PARSE_SECONDS) and start-up

# Byte classes a hostile or careless script is made of; a drawn unit of 1-8 bytes of one class is repeated.
CLASSES = {
    "NUL": b"\0",
    "C0 controls": bytes(range(1, 32)),
    "DEL": b"\x7f",
    "high bytes / invalid UTF-8": bytes(range(0x80, 0x100)),
    "long line": b"abcXYZ09_-=.,/:",
    "deep nesting": b"$(({[\"'`",
    "operators": b")(|&;<>a ",
    "expansions": b'$"{}[]@#!*?:-+=%/',
    "anything": bytes(range(256)),
}


def _unit(alphabet: bytes) -> st.SearchStrategy[bytes]:
    return st.lists(st.sampled_from(list(alphabet)), min_size=1, max_size=8).map(bytes)


UNITS = st.sampled_from(sorted(CLASSES)).flatmap(lambda name: _unit(CLASSES[name]))


def _cpu_seconds(tmp_path, unit: bytes, size: int) -> float:
    """CPU seconds to read a script of `size` bytes of `unit`, then a train command (read, or refused in a line)."""
    path = tmp_path / f"{size}.sh"
    path.write_bytes((unit * (size // len(unit) + 1))[:size] + b"\n" + TRAIN)
    start = time.process_time()
    try:
        parse_script(path)
    except UserError as error:
        assert "\n" not in str(error)
    return time.process_time() - start


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(unit=UNITS)
@example(unit=b"\0")  # before: 4 KiB 0.1 s, 16 KiB 1.3 s
@example(unit=b")a")  # 16 KiB 1.6 s, 64 KiB 24 s
@example(unit=b"a|")  # 20 KiB 2.5 s and 1 GB
@example(unit=b"x=(")
def test_reading_time_is_linear_in_size(tmp_path_factory, unit):
    tmp_path = tmp_path_factory.mktemp("linear")
    small = _cpu_seconds(tmp_path, unit, SMALL)
    large = _cpu_seconds(tmp_path, unit, 4 * SMALL)
    assert large < 6 * small + SLACK, (unit, small, large)


def test_a_script_of_nul_bytes_under_the_cap_reads_in_seconds(tmp_path):
    """4 MiB of NUL bytes around a train command: read as bash reads it (NUL dropped), with a note."""
    path = tmp_path / "nul.sh"
    half = (2 << 20) - 100
    path.write_bytes(b"\0" * half + b"\nX=1\0\0 \n" + TRAIN.replace(b"4\n", b"$X\0\n") + b"\0" * half)
    start = time.process_time()
    script = parse_script(path)
    assert time.process_time() - start < 5
    assert script.argv[-2:] == ["--num-layers", "1"]
    assert script.limits == [
        "line 1: 4,194,107 control character(s) removed before parsing, 4,194,107 of them NUL "
        "(bash drops NUL bytes too)"
    ]


def test_a_long_malformed_run_is_one_line_within_its_allowance(tmp_path):
    path = tmp_path / "run.sh"
    path.write_bytes(b"X=1\n" + b")a" * (64 << 10) + b"\n" + TRAIN)
    start = time.process_time()
    try:
        parse_script(path)
    except UserError as error:
        message = str(error)
    assert time.process_time() - start < 5  # the allowance: 0.25 s + 1.5 s per MiB read
    head = f"{path}: launch script: tree-sitter-bash gave up parsing it at line "
    assert re.fullmatch(
        re.escape(head) + r"[23], past its allowance \(0\.25 s of CPU \+ 1\.5 s per MiB read; 256 MiB \+ 256 bytes per "
        r"byte\): its error recovery is quadratic on a long malformed run \(`\)a\)a\.\.\.`, `a\|a\|\.\.\.\|`, "
        r"`x=\(x=\(\.\.\.`\); not a script nanscope can read",
        message,
    ), message
