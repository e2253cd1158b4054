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
