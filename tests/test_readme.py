"""The README's two commands: CI runs the test command verbatim; user-facing text names no path outside the package."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert blocks[:2] == ["pip install -e '.[repro]' && nanscope repro", "pip install -e '.[repro,test]' && pytest"]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert blocks[1] in ci  # .ci/run runs the README's test command, verbatim


def test_user_facing_text_names_no_path_outside_the_package():
    texts = [ROOT / "README.md", *sorted((ROOT / "src" / "nanscope" / "cases").rglob("*.md"))]
    for path in texts:
        assert "../shared" not in path.read_text(), path


def test_the_cpu_index_comes_before_the_install_commands():
    """Issue 42 newcomer item 7: the block pulled the multi-GB CUDA torch; the advice came after it."""
    readme = (ROOT / "README.md").read_text()
    before = readme[: readme.index("```bash\npip install -e '.[repro]'")]
    assert "export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" in before
    assert "--extra-index-url" in before


def test_the_test_tiers_name_no_count_that_drifts_and_say_where_slime_comes_from():
    """Issue 42 newcomer items 3 and 8: "1476 tests, 200 s" was not what a clone sees; nothing said where to get
    the checkouts the release tier needs."""
    readme = (ROOT / "README.md").read_text()
    tests = readme[readme.index("## The tests") : readme.index("## Documentation")]
    assert re.findall(r"\d+ tests|\d+ s\b|\(\d+ tests\)", tests) == []
    for where in ("https://github.com/THUDM/slime", "https://github.com/NVIDIA/Megatron-LM", "core_v0.15.0rc0",
                  "NANSCOPE_SLIME_SRC", "NANSCOPE_TEST_MEGATRON_LM_SRC", "NOT TESTED"):  # fmt: skip
        assert where in tests, where


def test_the_exit_code_row_of_trace_is_what_trace_exits():
    """Issue 42 newcomer item 3: the row said "1 cause in the loss", which `trace --hazard` never exits."""
    from nanscope.cli.main import main

    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `nanscope trace` |"))
    assert row.endswith("| 0 upstream of the loss (and `--hazard`, which shows the op), 1 cause in the loss (a bundle "
                        "or report directory) |")  # fmt: skip
    assert main(["trace", "--hazard", "kl-exp-overflow"]) == 0  # the cause in the loss, shown, exit 0
    assert main(["trace", str(ROOT / "examples" / "reports")]) == 1  # a report directory whose loss names it


def test_the_trace_output_shown_is_what_trace_prints(monkeypatch, capsys):
    """The README's step 4 shows `nanscope trace examples/reports/` as it prints, piped (100 columns): each line
    shown (but `...`) is one of its lines."""
    from nanscope.cli.main import main

    readme = (ROOT / "README.md").read_text()
    shown = readme[readme.index("```\nloss: nanscope's model of slime") + 4 :].split("```")[0].splitlines()
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["trace", "examples/reports/"]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert len(shown) > 5 and [line for line in shown if line != "..." and line not in printed] == []
