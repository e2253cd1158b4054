"""`nanscope scan DIR/ --json --html` over a drifting run: the trend's JSON and its chart."""

import contextlib
import io
import json
import re

import pytest

from nanscope.cli.main import main
from nanscope.dumps import demo

FILE_KEYS = [
    "path", "error", "kind", "rollout_id", "rank", "num_samples", "response_tokens", "would_nan", "mechanisms",
    "counts", "total", "errors", "seconds", "format",
]  # fmt: skip


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    """The drifting run's directory scanned once: (exit code, stdout, stderr, JSON, HTML)."""
    root = tmp_path_factory.mktemp("run")
    demo.write_drifting_run(root / "dumps", rollouts=6)
    js, page = root / "scan.json", root / "trend.html"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["scan", str(root / "dumps"), "--json", str(js), "--html", str(page), "--workers", "2"])
    return rc, out.getvalue(), err.getvalue(), json.loads(js.read_text()), page.read_text(), root


def test_the_json_keeps_its_keys_and_adds_the_trend(scanned):
    rc, out, err, doc, _, root = scanned
    assert (rc, err) == (1, "")  # rollout 5's bound is a finding
    assert list(doc) == ["files", "summary", "trend"]
    assert all(list(f) == FILE_KEYS for f in doc["files"])
    assert doc["summary"]["would_nan"] == {"yes": 0, "possibly": 1, "no": 10}
    trend = doc["trend"]
    assert [e["rollout_log_ratio_bound"] for e in trend["rollouts"]] == [1.0, 19.0, 37.0, 55.0, 73.0, 91.0]
    assert [e["max_kl_log_ratio"] for e in trend["rollouts"]] == [0.0, 18.0, 36.0, 54.0, 72.0, None]
    assert trend["first_hazard"]["rollout_id"] == 5 and trend["without_train_dump"] == [5]
    assert out.splitlines()[-1] == (
        "11 dumps, 176 samples, 11,264 response tokens: would produce NaN: 0 yes, 1 possibly, 10 no; 0 failed; "
        "2 findings"
    )


def test_the_html_draws_the_trend_with_the_limit_and_the_first_hazard(scanned):
    html = scanned[4]
    assert html.startswith("<!doctype html>") and "<script" not in html
    assert not re.search(r"(src|href)=", html)  # self-contained: nothing fetched
    assert html.count("<svg") == 2  # the log-ratio maxima, the gap
    # chart 1: KL, TIS, PPO bound over rollouts 0-4, the rollout bound over 0-5; chart 2: the gap's max, p99, mean
    assert html.count("<polyline") == 4 + 3
    assert html.count("<circle") == 5 + 5 + 5 + 6 + 3 * 5
    # y axis 0 to 91 * 1.1 = 100.1 over pixels 252 (bottom) to 34 (top): 88.72 at 252 - 218 * 88.72 / 100.1
    assert "<line x1='56' x2='936' y1='58.8' y2='58.8' stroke='#b00020' stroke-width='2'/>" in html
    assert ">fp32 exp overflow 88.72</text>" in html and ">guard clamp 20</text>" in html
    # rollouts 0-5 over x 68 to 924: rollout 5 at 924, its bound 91 at 252 - 218 * 91 / 100.1 = 53.8
    assert html.count("<line class='first-hazard' x1='924.0' x2='924.0'") == 2
    assert "first hazard: rollout 5 (possibly): the run was heading here</text>" in html
    assert "<circle cx='924.0' cy='53.8' r='4' fill='#fff' stroke='#555555' stroke-width='1.5'>" in html
    assert "<title>rollout 5: rollout_log_ratio_bound 91 (" in html
    assert html.count("fill='#777'>no train dump</text>") == 2
    assert (
        "<p class='muted no-train-dump-note'>no train dump for rollout 5: slime writes a rollout&#x27;s train dump "
        "after its training, so the rollout whose training failed has none; its point is the rollout dump&#x27;s "
        "bound</p>"
    ) in html
    assert "<td>5</td><td>0 / 1</td><td>-</td>" in html and "<td>rollout_data/5.pt</td>" in html


def test_html_of_a_directory_with_a_bad_dump_still_fails_in_one_line(tmp_path, capsys):
    demo.write_demo(tmp_path / "12.pt")
    (tmp_path / "13.pt").write_bytes(b"PK\x03\x04 truncated")
    rc = main(["scan", str(tmp_path), "--html", str(tmp_path / "x.html"), "--workers", "1"])
    _, err = capsys.readouterr()
    assert rc == 2 and err.startswith(f"nanscope scan: error: 1 of 2 dumps failed; the first: {tmp_path}/13.pt: ")
    html = (tmp_path / "x.html").read_text()
    assert "<td>13.pt</td><td>-</td>" in html and html.count("<svg") == 2  # rollout 12 alone, bounds only
    assert "no train dumps (--save-debug-train-data): every point is a rollout dump&#x27;s bound" in html
