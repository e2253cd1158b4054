"""nanscope.inputs: path templates filled as slime fills them but bounded, text from files made printable, JSON and
kernel file systems refused in one line (issue 32 items 1, 4, 5, 11)."""

from __future__ import annotations

import os

import pytest

from nanscope.errors import UserError
from nanscope.inputs import check_file, fill_template, kernel_file_system, printable, read_json


@pytest.mark.parametrize(
    ("template", "path"),
    [
        ("/dumps/rollout_data/{rollout_id}.pt", "/dumps/rollout_data/12.pt"),  # slime's default (arguments.py:945)
        ("/dumps/{rollout_id:04d}.pt", "/dumps/0012.pt"),
        ("/dumps/{rollout_id}_{rank}.pt", "/dumps/12_3.pt"),  # --save-debug-train-data's
        ("/dumps/{rollout_id:>6}.pt", "/dumps/    12.pt"),
        ("/dumps/{{braces}}/{rollout_id}.pt", "/dumps/{braces}/12.pt"),
        ("/dumps/plain.pt", "/dumps/plain.pt"),
    ],
)
def test_a_template_fills_rollout_id_and_rank_as_str_format_does(template, path):
    assert fill_template(template, "--rollout", rollout_id=12, rank=3) == path == template.format(rollout_id=12, rank=3)


@pytest.mark.parametrize(
    ("template", "why"),
    [
        # str.format would allocate 3 GB for this 6 KB bundle's field (issue 32 item 5)
        ("{rollout_id:>3000000000}", "{rollout_id:>3000000000}: expected an integer format of width <= 64, e.g. "
         "{rollout_id:04d}"),
        ("{rollout_id:065d}", "{rollout_id:065d}: expected an integer format of width <= 64, e.g. {rollout_id:04d}"),
        ("{rollout_id:{rank}}", "{rollout_id:{rank}}: expected an integer format of width <= 64, e.g. "
         "{rollout_id:04d}"),
        ("{rollout_id:x}", "{rollout_id:x}: expected an integer format of width <= 64, e.g. {rollout_id:04d}"),
        ("{0}", "{0}: a path template fills only {rollout_id}, {rank}"),
        ("{}", "{}: a path template fills only {rollout_id}, {rank}"),
        ("{rollout_id.__class__}", "{rollout_id.__class__}: a path template fills only {rollout_id}, {rank}"),
        ("{rollout_id[0]}", "{rollout_id[0]}: a path template fills only {rollout_id}, {rank}"),
        ("{rollout_id!r}", "{rollout_id!r}: a path template fills only {rollout_id}, {rank}"),
        ("{", "not a path template: Single '{' encountered in format string"),
    ],
)  # fmt: skip
def test_anything_else_in_a_template_is_refused_in_one_line(template, why):
    with pytest.raises(UserError) as raised:
        fill_template(template, "--rollout", rollout_id=12, rank=3)
    assert str(raised.value) == f"--rollout {template!r}: {why}"


def test_printable_escapes_what_could_drive_a_terminal():
    assert printable("a\nrefused: nothing\r\x1b]0;title\x07\x1b[2J\u200b\tb") == (
        "a\\nrefused: nothing\\r\\x1b]0;title\\x07\\x1b[2J\\u200b\\tb"
    )
    assert printable("rollout 1 step 0: [/] é µ") == "rollout 1 step 0: [/] é µ"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "not valid JSON: Expecting property name enclosed in double quotes at line 1"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested too deeply"),
        (
            '{"rank": ' + "9" * 5000 + "}",
            "not valid JSON: Exceeds the limit (4300 digits) for integer string conversion",
        ),
    ],
    ids=["syntax", "deep", "digits"],
)
def test_read_json_refuses_what_json_loads_raises_in_one_line(tmp_path, text, why):
    (tmp_path / "r.json").write_text(text)
    with pytest.raises(UserError) as raised:
        read_json(tmp_path / "r.json", "report")
    assert str(raised.value) == f"{tmp_path / 'r.json'}: report: {why}"


def test_kernel_file_systems_are_refused_by_their_resolved_path(tmp_path):
    os.symlink("/proc/self/status", tmp_path / "status.pt")
    assert [kernel_file_system(p) for p in ("/proc/kmsg", "/sys/x", "/dev/zero", "/dev/shm/x", "/devx", "/tmp")] == [
        "/proc", "/sys", "/dev", None, None, None,
    ]  # fmt: skip
    with pytest.raises(UserError) as raised:
        check_file(tmp_path / "status.pt", "dump")
    assert str(raised.value) == (
        f"{tmp_path / 'status.pt'}: dump: resolves to /proc/{os.getpid()}/status, in /proc, a kernel file system "
        "whose reads can block or fail: not read (copy the file elsewhere first)"
    )
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):  # tmpfs: plain files, read as any
        with open(f"/dev/shm/nanscope-test-{os.getpid()}", "w") as f:
            f.write("x")
        try:
            assert check_file(f.name, "dump") == 1
        finally:
            os.unlink(f.name)
