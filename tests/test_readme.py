"""The README's test command is exactly what CI runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert blocks[:2] == ["pip install -e . && nanscope repro", "pip install -e '.[test]' && pytest"]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == blocks[1]  # the last line of .ci/run is the README's test command, verbatim
