"""`repro --fault --fault-once`'s rendering names the flag and says what a one-time fault's run can show (issue 42,
newcomer item 6). The launch itself is tests/cli/test_repro_fault.py's."""

from rich.console import Console

from nanscope.causes import catalogue
from nanscope.report import repro as report
from nanscope.report import table
from nanscope.repro.matrix import Matrix, MatrixRow
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


def test_the_matrix_keeps_every_hazard_name_whole_at_any_width():
    """Issue 42 newcomer item 9: at 80 columns the matrix's seven columns cut the names mid-word ("kl-exp-o" /
    "verflow"); where its words do not fit, each row is a block of lines."""

    def run(name: str, loss: str) -> Repro:
        return Repro(hazard=name, loss=loss, expected="completed", observed="completed", layout={})

    rows = [MatrixRow(h.name, "", run(h.name, "as-is"), run(h.name, "safe"), 0.0) for h in catalogue.CATALOGUE]
    for width in (80, 100, 160):
        console = Console(width=width, record=True)
        report.render_matrix(Matrix(rows=rows, wall_s=1.0, layout={}, notes=[]), console)
        lines = console.export_text().splitlines()
        assert max(map(len, lines)) <= width
        table_row = [line for line in lines if "│ moe-zero-token-expert " in line]
        assert (lines.count("hazard moe-zero-token-expert"), len(table_row)) == ((1, 0) if width == 80 else (0, 1))
        assert ("  as-is (slime v0.1.0): completed" in lines) is (width == 80)  # 88 columns keep every word whole


def test_a_table_needs_its_longest_word_per_column_plus_borders():
    assert (
        table.needed(("hazard", "as-is"), [("kl-exp-overflow", "[red]UNEXPECTED[/] completed")]) == 15 + 10 + 3 * 2 + 1
    )
