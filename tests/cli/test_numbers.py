"""Every numeric option of every command: one set of types (nanscope.cli.numbers), ASCII digits, a documented range,
one line and exit 2 for anything else (issue 42)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nanscope.cli import numbers
from nanscope.cli.main import build_parser, main


def _options():
    """(command, option, type) of every option that takes a value, over every command's parser."""
    parser, _ = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in commands.items():
        for action in sub._actions:
            if action.option_strings and action.nargs != 0:
                yield name, action.option_strings[0], action.type


def test_every_numeric_option_takes_one_of_the_shared_types():
    shared = (numbers.Integer, numbers.Decimal, numbers.Mebibytes)
    plain = [(command, option) for command, option, kind in _options() if kind in (int, float)]
    assert plain == []  # int() and float() take '٥٠' and '1e-300'
    typed = sorted((command, option) for command, option, kind in _options() if isinstance(kind, shared))
    assert len(typed) == 22, typed


SEED = "expected an integer from 0 to 4,294,967,295"
MIB = "expected a size in MiB from 0.0000010 (one byte) to 1,048,576"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["hazards", "--seed", "18446744073709551616"], f"argument --seed: '18446744073709551616': {SEED}"),
        (["trace", "--hazard", "healthy", "--seed", "18446744073709551616"],
         f"argument --seed: '18446744073709551616': {SEED}"),
        (["repro", "--seed", str(2**64)], f"argument --seed: '18446744073709551616': {SEED}"),
        (["repro", "--natural", "--seed", str(2**60)], f"argument --seed: '1152921504606846976': {SEED}"),
        (["repro", "--seed", "-1"], f"argument --seed: '-1': {SEED}"),
        (["doctor", "--case", "slime-795", "--rank", "٥٠"],
         "argument --rank: '٥٠': expected an integer from 0 to 2,147,483,647"),
        (["doctor", "--case", "slime-795", "--rank", str(2**63)],
         "argument --rank: '9223372036854775808': expected an integer from 0 to 2,147,483,647"),
        (["doctor", "--case", "slime-795", "--max-input-mb", "1e-300"], f"argument --max-input-mb: '1e-300': {MIB}"),
        (["trace", "x.pt", "--max-input-mb", "nan"], f"argument --max-input-mb: 'nan': {MIB}"),
        (["trace", "x.pt", "--max-input-mb", "１"], f"argument --max-input-mb: '１': {MIB}"),
        (["scan", "d", "--workers", "0"], "argument --workers: '0': expected an integer from 1 to 1,024"),
        (["scan", "d", "--max-rows", "-5"], "argument --max-rows: '-5': expected an integer from 0 to 1,000,000"),
        (["scan", "d", "--rollout-max-response-len", "-1"],
         "argument --rollout-max-response-len: '-1': expected an integer from 1 to 2,147,483,647"),
        (["scan", "d", "--n-samples-per-prompt", "３"],
         "argument --n-samples-per-prompt: '３': expected an integer from 1 to 65,536"),
        (["scan", "d", "--max-rows", "1" * 50],
         f"argument --max-rows: {'1' * 40!r}... (50 characters): expected an integer from 0 to 1,000,000"),
        (["repro", "--timeout", "inf"], "argument --timeout: 'inf': expected a number of seconds > 0 and <= 604800"),
        (["repro", "--steps", "101"], "argument --steps: '101': expected an integer from 1 to 100"),
        (["repro", "--natural", "--lr", "0"], "argument --lr: '0': expected a number > 0 and <= 1"),
    ],
)  # fmt: skip
def test_a_value_out_of_its_range_is_one_line_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err.splitlines()
    assert exited.value.code == 2
    assert err[-1].startswith(f"nanscope {argv[0]}: error: {message}"), err  # argparse's line (one line: cli.help)


def test_each_range_ends_where_its_docs_say(capsys):
    assert numbers.SEED("4294967295") == 2**32 - 1 and numbers.RANK(" 50 ") == 50
    assert numbers.MEBIBYTES("4") == 4 << 20 and numbers.MEBIBYTES("0.0000010") == 1
    assert numbers.SECONDS("2.5") == 2.5 and numbers.SECONDS("604800") == 604800.0
    for kind, text in ((numbers.SEED, "4294967296"), (numbers.MEBIBYTES, "0.0000009"), (numbers.SECONDS, "-0")):
        with pytest.raises(argparse.ArgumentTypeError):
            kind(text)


def test_every_numeric_option_is_in_the_docs_table():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "index.md").read_text()
    table = docs[docs.index("- **Numbers**") : docs.index("Numbers a file gives")]
    shared = (numbers.Integer, numbers.Decimal, numbers.Mebibytes)
    missing = sorted({option for _, option, kind in _options() if isinstance(kind, shared)} - set(table.split("`")))
    assert missing == []
