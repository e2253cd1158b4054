"""`repro --fault --fault-once`'s rendering names the flag and says what a one-time fault's run can show (issue 42,
newcomer item 6). The launch itself is tests/cli/test_repro_fault.py's."""

from rich.console import Console

from nanscope.report import repro as report
from nanscope.repro.runs import TRANSIENT_NOTE, Repro


def test_the_header_names_fault_once_and_a_note_says_no_rerun_verdict():
    console = Console(width=100, record=True)
    rep = Repro(hazard="healthy", loss="as-is", expected="completed", observed="completed", layout={},
                fault="decoder.layers.1.mlp:forward:inf", fault_once=True, notes=[TRANSIENT_NOTE])  # fmt: skip
    report.render(rep, console)
    text = console.export_text()
    assert " ".join(text.split()).startswith(  # the title, wrapped at the table's width
        "nanscope repro --hazard healthy --loss as-is --fault decoder.layers.1.mlp:forward:inf --fault-once "
    )
    assert " ".join(text.split()).count("note: --fault-once: a transient fault (it fires once): megatron's check") == 1
