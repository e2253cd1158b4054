"""The CLI's progress lines on stderr (issue 42 item 3): plain lines when stderr is no terminal, none with --quiet;
the lines the repro layers make from a launch's events."""

from nanscope import natural
from nanscope.causes import catalogue
from nanscope.cli import progress
from nanscope.megatron.spec import RunSpec
from nanscope.repro import matrix


def test_plain_lines_when_piped_and_none_when_quiet(capsys):
    with progress.Lines("repro", quiet=False, total=2) as lines:
        lines("run 1 of 2 done: healthy, as-is")
        lines("a \x1b]0;title\x07 name")
    assert capsys.readouterr().err == (
        "nanscope repro: run 1 of 2 done: healthy, as-is\nnanscope repro: a \\x1b]0;title\\x07 name\n"
    )
    with progress.Lines("repro", quiet=True) as lines:
        lines("run 1 of 2 done: healthy, as-is")
    assert capsys.readouterr().err == ""


def test_a_plain_line_folds_at_the_width(capsys, monkeypatch):
    """`scan DIR` piped at COLUMNS=80 wrote 84- and 85-column lines (`nanscope scan: file 1 of 2: PATH: 4 findings,
    would produce NaN: yes`)."""
    monkeypatch.setenv("COLUMNS", "80")
    with progress.Lines("scan", quiet=False, total=2, bar=False) as lines:
        lines("file 2 of 2: runs/2026-12-05/sc/rollout_data/3.pt: 13 findings, would produce NaN: yes")
    assert capsys.readouterr().err == (
        "nanscope scan: file 2 of 2: runs/2026-12-05/sc/rollout_data/3.pt: 13 findings,\n    would produce NaN: yes\n"
    )


def test_the_matrix_says_each_run_and_the_natural_loop_each_step():
    said = []
    specs = [RunSpec(hazard=catalogue.HEALTHY.name, loss=loss) for loss in ("as-is", "safe")]
    done = matrix._runs_done(specs, said.append)
    done(0, 1, 1)  # a step of a one-step run: the run's line says it
    done(0, None, None)
    done(1, None, None)
    steps = natural._steps_done(said.append)
    steps(0, 3, 40)
    steps(1, None, None)
    assert said == [
        "run 1 of 2 done: healthy, as-is",
        "run 2 of 2 done: healthy, safe",
        "as-is run: step 3 of 40",
        "plugin run done",
    ]
    assert matrix._runs_done(specs, None) is None and natural._steps_done(None) is None
