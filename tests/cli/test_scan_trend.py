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


def _main(*argv) -> tuple[int, str, str]:
    """The command at 160 columns (its rows are read whole here; the width rule is tests/cli/test_terminal.py's)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "160")
        rc = main([*argv, "--quiet"])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    """The drifting run's directory, written by `scan --write-demo DIR --demo-kind run` and scanned once: (exit
    code, stdout, stderr, JSON, HTML, the root, --write-demo's stdout)."""
    root = tmp_path_factory.mktemp("run")
    wrote = _main("scan", "--write-demo", str(root / "dumps"), "--demo-kind", "run")
    assert wrote[0] == 0 and wrote[2] == ""
    js, page = root / "scan.json", root / "trend.html"
    rc, out, err = _main("scan", str(root / "dumps"), "--json", str(js), "--html", str(page), "--workers", "2")
    return rc, out, err, json.loads(js.read_text()), page.read_text(), root, wrote[1]


def test_write_demo_run_writes_the_drifting_run_as_slime_lays_out_its_dumps(scanned, tmp_path):
    root, wrote = scanned[5], scanned[6]
    dumps = root / "dumps"
    assert sorted(str(p.relative_to(dumps)) for p in dumps.rglob("*")) == [
        "rollout_data", *(f"rollout_data/{i}.pt" for i in range(6)), "train_data",
        *(f"train_data/{i}_0.pt" for i in range(5)),
    ]  # fmt: skip
    assert " ".join(wrote.split()) == (  # wrapped at the width between words
        f"wrote a drifting run of 6 rollouts under {dumps} (slime v0.1.0 format): rollout dumps rollout_data/0.pt .. "
        "5.pt, train dumps train_data/0_0.pt .. 4_0.pt (the last rollout's training is the one that fails: no train "
        "dump); a masked token's KL log-ratio grows 18 a rollout, 0 .. 90, past 88.72 at rollout 5 "
        f"now run: nanscope scan {dumps} --html trend.html"
    )
    assert wrote.splitlines()[-1] == f"now run: nanscope scan {dumps} --html trend.html"
    # the files the library's writer writes
    demo.write_drifting_run(tmp_path)
    assert [p.relative_to(tmp_path) for p in demo.drifting_run_paths(tmp_path)] == [
        p.relative_to(dumps) for p in demo.drifting_run_paths(dumps)
    ]
    # again: nothing replaced without --force (one line, exit 2), every file replaced with it
    before = {p: p.stat().st_mtime_ns for p in dumps.rglob("*.pt")}
    rc, out, err = _main("scan", "--write-demo", str(dumps), "--demo-kind", "run")
    assert (rc, out, err) == (
        2, "", f"nanscope scan: error: --write-demo {dumps}/rollout_data/0.pt: exists (pass --force to replace it)\n"
    )  # fmt: skip
    assert {p: p.stat().st_mtime_ns for p in dumps.rglob("*.pt")} == before
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert _main("scan", "--write-demo", str(a_file), "--demo-kind", "run")[2] == (
        f"nanscope scan: error: --write-demo {a_file}: not a directory (--demo-kind run writes a directory)\n"
    )
    assert _main("scan", "--write-demo", str(tmp_path), "--demo-kind", "run", "--force")[0] == 0


def test_scan_of_the_directory_prints_the_trend_s_first_hazard(scanned):
    rc, out = scanned[0], scanned[1]
    assert rc == 1 and out.splitlines()[-1] == (
        "trend over 6 rollouts (0-5): first hazard at rollout 5 (would produce NaN: possibly, via kl-exp-overflow, "
        "ratio-exp-overflow): the run was heading here"
    )


@pytest.mark.slow  # a worker pool's scan of a disagreeing directory; the fast tier keeps the trend's own tests
def test_demos_take_their_rollout_from_their_names_and_a_disagreement_is_one_line(tmp_path):
    for name, rollout in (("3.pt", 3), ("4.pt", 4), ("notes.pt", 12)):  # 12: the demo's own, where the name has none
        rc, out, _ = _main("scan", "--write-demo", str(tmp_path / "d" / name))
        assert rc == 0 and out.startswith(f"wrote rollout dump {tmp_path}/d/{name} (rollout {rollout}, slime v0.1.0 ")
    (tmp_path / "d" / "9.pt").write_bytes((tmp_path / "d" / "3.pt").read_bytes())  # a copy under another name
    rc, out, _ = _main("scan", str(tmp_path / "d"), "--json", str(tmp_path / "s.json"), "--workers", "2")
    series = json.loads((tmp_path / "s.json").read_text())["trend"]
    # each placed at the id it stores: 3, 4, 12 (notes.pt, no id in its name), and 9.pt's copy of rollout 3 at 3
    assert [(e["rollout_id"], e["rollout_dumps"]) for e in series["rollouts"]] == [(3, 2), (4, 1), (12, 1)]
    assert series["id_disagrees"] == [{"path": f"{tmp_path}/d/9.pt", "rollout_id": 3, "name_rollout": 9}]
    assert rc == 1 and " ".join(out.split()).endswith(  # the two lines, wrapped at the width between words
        "trend over 3 rollouts (3-12): first hazard at rollout 3 (would produce NaN: yes, via nan-rollout-logprob, "
        "nan-reward, kl-exp-overflow, ratio-exp-overflow): the run was heading here "
        "rollout ids: 1 file(s) store a rollout_id their name does not give (9.pt stores 3, its name says 9): each "
        "is placed at the id it stores"
    )


def test_the_json_keeps_its_keys_and_adds_the_trend(scanned):
    rc, out, err, doc, _, root, _ = scanned
    assert (rc, err) == (
        1,
        f"nanscope scan: wrote {root}/scan.json (--json), {root}/trend.html (--html)\n",
    )  # rollout 5's bound is a finding
    assert list(doc) == ["files", "summary", "trend"]
    assert all(list(f) == FILE_KEYS for f in doc["files"])
    assert doc["summary"]["would_nan"] == {"yes": 0, "possibly": 1, "no": 10}
    trend = doc["trend"]
    assert [e["rollout_log_ratio_bound"] for e in trend["rollouts"]] == [1.0, 19.0, 37.0, 55.0, 73.0, 91.0]
    assert [e["max_kl_log_ratio"] for e in trend["rollouts"]] == [0.0, 18.0, 36.0, 54.0, 72.0, None]
    assert trend["first_hazard"]["rollout_id"] == 5 and trend["without_train_dump"] == [5]
    assert out.splitlines()[-2] == (
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
    rc = main(["scan", str(tmp_path), "--html", str(tmp_path / "x.html"), "--workers", "1", "--quiet"])
    _, err = capsys.readouterr()
    assert rc == 2 and err.startswith(f"nanscope scan: error: 1 of 2 dumps failed; the first: {tmp_path}/13.pt: ")
    html = (tmp_path / "x.html").read_text()
    assert "<td>13.pt</td><td>-</td>" in html and html.count("<svg") == 2  # rollout 12 alone, bounds only
    assert "no train dumps (--save-debug-train-data): every point is a rollout dump&#x27;s bound" in html
