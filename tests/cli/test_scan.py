"""`nanscope scan` through argv: exit codes, one-line errors, the table, JSON and HTML."""

import json
import os

import pytest
import torch

from nanscope import case
from nanscope.cli.main import main
from nanscope.dumps import demo, writers
from tests.dumps.test_io import MkdirOnLoad


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    """These tests read the table's rows at 160 columns; the width rule itself is tests/cli/test_terminal.py's."""
    monkeypatch.setenv("COLUMNS", "160")


def wrote(**flags) -> str:
    """The line --json / --html end with."""
    return f"nanscope scan: wrote {', '.join(f'{path} (--{flag})' for flag, path in flags.items())}\n"


def run(capsys, *argv):
    """`nanscope scan ARGV --quiet` (a directory's lines a file: test_a_directory_scan_says_each_file_it_scanned)."""
    rc = main(["scan", *argv, "--quiet"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_newcomer_demo_finds_every_planted_hazard(tmp_path, capsys):
    dump = str(tmp_path / "rollout_data" / "12.pt")
    rc, out, _ = run(capsys, "--write-demo", dump)
    assert rc == 0 and out.splitlines()[0] == (
        f"wrote rollout dump {dump} (rollout 12, slime v0.1.0 format) with 4 planted hazards:"
    )
    rc, out, err = run(capsys, dump, "--json", str(tmp_path / "s.json"), "--html", str(tmp_path / "s.html"))
    assert (rc, err) == (1, wrote(json=tmp_path / "s.json", html=tmp_path / "s.html"))
    lines = [" ".join(ln.split()) for ln in out.splitlines()]
    # sample token abs_token masked value kind mechanism note (the table is 160 wide when piped)
    assert "9 17 41 false nan nonfinite-rollout-logprob nan-rollout-logprob" in lines
    assert "12 40 64 true 100 kl-margin kl-exp-overflow?" in lines
    assert "3 nan nonfinite-reward nan-reward" in lines
    assert "14 0 zero-loss-mask - loss_mask sums to 0" in lines
    assert lines[-1] == (
        "slime v0.1.0 would produce NaN: yes, via nan-rollout-logprob, nan-reward; possibly also "
        "via kl-exp-overflow, ratio-exp-overflow (bounds only)"
    )

    doc = json.loads((tmp_path / "s.json").read_text())
    assert set(doc) == {"dump", "format", "config", "hazards", "summary"}
    assert doc["hazards"][9] == {
        "kind": "nonfinite-rollout-logprob",
        "mechanism": "nan-rollout-logprob",
        "sample": 9,
        "token": 17,
        "abs_token": 41,
        "masked": False,
        "value": "nan",
        "certain": True,
        "detail": "",
    }
    assert doc["hazards"][10]["value"] == 100.0 and doc["hazards"][10]["certain"] is False
    assert doc["summary"]["counts"] == {
        "nonfinite-reward": 1,
        "grpo-nonfinite": 8,
        "nonfinite-rollout-logprob": 1,
        "kl-margin": 1,
        "ratio-margin": 1,
        "length-mismatch": 0,
        "zero-loss-mask": 1,
        "response-too-long": 0,
    }
    assert (doc["summary"]["would_nan"], doc["summary"]["total"]) == ("yes", 13)
    assert doc["dump"] == {
        "path": dump,
        "kind": "rollout",
        "rollout_id": 12,
        "rank": None,
        "num_samples": 16,
        "response_tokens": 1024,
    }
    assert doc["format"] == {
        "release": "v0.1.0",
        "same_as": ["v0.1.0"],
        "fields_added": [],
        "fields_removed": [],
        "rollout_logprob_dtype": "bfloat16",
        "note": "",
    }
    assert lines[1] == "format: slime v0.1.0; rollout_log_probs checked as bfloat16"

    html = (tmp_path / "s.html").read_text()
    assert html.count("<svg") == 3  # kl-margin and ratio-margin histograms, the hazard map
    assert "fp32 exp limit 88.72" in html and "sample 12: 1 kl-margin" in html
    assert "<p class='muted'>format: slime v0.1.0; rollout_log_probs checked as bfloat16</p>" in html


def test_train_demo_verdict_and_exit(tmp_path, capsys):
    dump = str(tmp_path / "12_0.pt")
    assert run(capsys, "--write-demo", dump, "--demo-kind", "train")[0] == 0
    rc, out, _ = run(capsys, dump)
    assert rc == 1
    assert "5 40 64 true 95 kl-margin kl-exp-overflow" in [" ".join(ln.split()) for ln in out.splitlines()]
    verdict = "slime v0.1.0 would produce NaN: yes, via kl-exp-overflow, nan-rollout-logprob"
    assert out.splitlines()[-1].startswith(verdict)


def test_clean_dump_exits_0(tmp_path, capsys):
    samples = [demo.rollout_sample(i, 4, 8, reward=float(i % 2)) for i in range(8)]
    path = writers.write_rollout_dump(tmp_path / "0.pt", samples)
    rc, out, _ = run(capsys, str(path))
    assert rc == 0 and out.splitlines()[-1] == "slime v0.1.0 would produce NaN: no"


def test_flags_change_the_verdict(tmp_path, capsys):
    samples = [demo.rollout_sample(i, 4, 8, reward=float(i % 2)) for i in range(8)]
    samples[2]["rollout_log_probs"][1] = float("nan")
    path = str(writers.write_rollout_dump(tmp_path / "0.pt", samples))
    assert run(capsys, path)[1].splitlines()[-1] == "slime v0.1.0 would produce NaN: yes, via nan-rollout-logprob"
    rc, out, _ = run(capsys, path, "--no-use-tis")
    assert rc == 1 and out.splitlines()[-1] == "slime v0.1.0 would produce NaN: no"  # still listed, no mechanism


def test_code_executing_pickle_refused_exit_2_marker_absent(tmp_path, capsys):
    marker = tmp_path / "marker"
    path = tmp_path / "12.pt"
    torch.save({"rollout_id": 12, "samples": [MkdirOnLoad(str(marker))]}, path)
    rc, out, err = run(capsys, str(path))
    assert (rc, out) == (2, "")
    assert err == (
        f"nanscope scan: error: {path}: sample 0: refused: loading it needs arbitrary unpickling (it "
        "references posix.mkdir); nanscope reads dumps with a restricted unpickler, a subset of "
        "torch.load(weights_only=True). If you trust the file, rerun with --trust-pickle\n"
    )
    assert not marker.exists()
    # With --trust-pickle the payload runs (the flag is what allows it); the result is still no dump.
    rc, _, err = run(capsys, str(path), "--trust-pickle")
    assert rc == 2 and marker.is_dir()
    assert err == f"nanscope scan: error: {path}: sample 0: expected a Sample.to_dict() dict, got NoneType\n"


def test_truncated_file_one_line_exit_2(tmp_path, capsys):
    good = tmp_path / "good.pt"
    demo.write_demo(good)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(good.read_bytes()[:3000])
    rc, out, err = run(capsys, str(bad))
    assert (rc, out) == (2, "") and err.count("\n") == 1
    assert err.startswith(f"nanscope scan: error: {bad}: unreadable torch.save file (") and "Traceback" not in err


def test_length_mismatch_renders_then_exits_2(tmp_path, capsys):
    samples = [demo.rollout_sample(i, 4, 8, reward=float(i % 2)) for i in range(8)]
    samples[5]["loss_mask"] = [1] * 6
    samples[6]["loss_mask"] = [1] * 9
    path = writers.write_rollout_dump(tmp_path / "0.pt", samples)
    rc, out, err = run(capsys, str(path), "--json", str(tmp_path / "s.json"))
    assert rc == 2
    assert err == (
        f"nanscope scan: error: {path}: loss_mask of sample 5: length 6 != response_length 8 "
        "(and 1 more; see the table)\n"
    )
    assert "length-mismatch" in out
    assert json.loads((tmp_path / "s.json").read_text())["summary"]["counts"]["length-mismatch"] == 2


def test_wrong_structure_and_bad_flags_exit_2(tmp_path, capsys):
    path = tmp_path / "x.pt"
    torch.save({"rollout_data": [1]}, path)
    rc, _, err = run(capsys, str(path))
    assert (rc, err) == (2, f"nanscope scan: error: {path}: rollout_data: expected a dict of per-key lists, got list\n")
    with pytest.raises(SystemExit) as exited:  # argparse's error (nanscope.cli.numbers' types)
        run(capsys, str(path), "--n-samples-per-prompt", "0")
    err = capsys.readouterr().err.splitlines()[-1]
    assert exited.value.code == 2
    assert err.startswith("nanscope scan: error: argument --n-samples-per-prompt: '0': expected an integer from 1 to ")
    rc, _, err = run(capsys)
    assert (rc, err) == (
        2,
        "nanscope scan: error: no dump given (try: nanscope scan --write-demo rollout_data/12.pt)\n",
    )


def test_help_states_defaults(capsys):
    try:
        main(["scan", "--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for text in (
        "GRPO group size (default 8)",
        "(default 61440)",
        "--trust-pickle",
        "exit status: 0 no hazard, 1 hazards found, 2 unreadable",
        "examples:",
    ):
        assert text in " ".join(out.split()), text


def test_progress_bar_goes_to_stderr(tmp_path, capsys):
    dump = str(tmp_path / "12.pt")
    demo.write_demo(dump)
    rc, out, err = run(capsys, dump, "--progress")
    assert rc == 1 and out.splitlines()[-1].startswith("slime v0.1.0 would produce NaN: yes")
    assert "Traceback" not in err


def test_unwritable_output_is_one_line(tmp_path, capsys):
    dump = str(tmp_path / "12.pt")
    demo.write_demo(dump)
    rc, out, err = run(capsys, dump, "--json", str(tmp_path / "no" / "such" / "dir.json"))
    assert (rc, out, err) == (
        2,
        "",
        f"nanscope scan: error: --json {tmp_path}/no/such/dir.json: no such directory: {tmp_path}/no/such\n",
    )  # refused before loading: no table


def test_flag_defaults_are_the_case(tmp_path):
    from nanscope.cli.main import build_parser

    args = build_parser()[0].parse_args(["scan", "x.pt"])
    defaults = case.scan_config()
    got = {k: getattr(args, k) for k in vars(defaults) if hasattr(args, k)}
    assert got == {k: v for k, v in vars(defaults).items() if k not in ("max_listed", "histograms")}


def test_directory_scans_every_dump_with_one_summary(tmp_path, capsys):
    demo.write_demo(tmp_path / "rollout_data" / "12.pt")
    demo.write_demo(tmp_path / "train_data" / "12_0.pt", kind="train")
    clean = [demo.rollout_sample(i, 4, 8, reward=float(i % 2)) for i in range(8)]
    writers.write_rollout_dump(tmp_path / "rollout_data" / "13.pt", clean, rollout_id=13)
    (tmp_path / "notes.txt").write_text("not a dump")
    rc, out, err = run(capsys, str(tmp_path), "--json", str(tmp_path / "s.json"), "--workers", "2")
    assert (rc, err) == (1, wrote(json=tmp_path / "s.json"))
    lines = [" ".join(ln.split()) for ln in out.splitlines()]
    assert (
        "rollout_data/12.pt rollout v0.1.0 16 1,024 13 yes nan-rollout-logprob, nan-reward, kl-exp-overflow, "
        "ratio-exp-overflow"
    ) in lines
    assert "rollout_data/13.pt rollout v0.1.0 8 64 0 no -" in lines
    assert (
        "train_data/12_0.pt train v0.1.0 16 1,024 4 yes kl-exp-overflow, nan-rollout-logprob, ratio-exp-overflow"
    ) in lines
    assert " ".join(out.split()).endswith(  # the two lines, wrapped at the width between words
        "3 dumps, 40 samples, 2,112 response tokens: would produce NaN: 2 yes, 0 possibly, 1 no; 0 failed; 17 findings "
        "trend over 2 rollouts (12-13): first hazard at rollout 12 (would produce NaN: yes, via nan-rollout-logprob, "
        "nan-reward, kl-exp-overflow, ratio-exp-overflow): the run was heading here"
    )
    doc = json.loads((tmp_path / "s.json").read_text())
    assert [f["path"] for f in doc["files"]] == [f"{tmp_path}/rollout_data/{n}.pt" for n in (12, 13)] + [
        f"{tmp_path}/train_data/12_0.pt"
    ]
    assert doc["files"][0]["counts"]["grpo-nonfinite"] == 8 and doc["summary"]["failed"] == 0


def test_directory_with_a_bad_dump_reports_it_and_exits_2(tmp_path, capsys):
    demo.write_demo(tmp_path / "12.pt")
    (tmp_path / "13.pt").write_bytes(b"PK\x03\x04 truncated")
    rc, out, err = run(capsys, str(tmp_path), "--workers", "1")
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(
        f"nanscope scan: error: 1 of 2 dumps failed; the first: {tmp_path}/13.pt: unreadable torch.save file ("
    )
    assert "; 1 failed;" in " ".join(out.split())
    assert "\ntrend over 1 rollout (12): first hazard at rollout 12 (would produce NaN" in out
    # --html on a directory draws the run's trend (tests/cli/test_scan_trend.py)
    (tmp_path / "empty").mkdir()
    rc, _, err = run(capsys, str(tmp_path / "empty"))
    assert (rc, err) == (2, f"nanscope scan: error: {tmp_path}/empty: no *.pt dumps in this directory or below\n")


def test_a_directory_says_what_it_skipped_and_a_kernel_directory_is_refused(tmp_path, capsys):
    """issue 42: FIFOs, device links and directories named like dumps were skipped silently; `scan /proc` was an
    internal error."""
    demo.write_demo(tmp_path / "12.pt")
    os.mkfifo(tmp_path / "13.pt")
    os.symlink("/dev/zero", tmp_path / "14.pt")
    (tmp_path / "15.pt").mkdir()
    os.symlink("missing.pt", tmp_path / "16.pt")
    rc, out, err = run(capsys, str(tmp_path), "--workers", "1")
    assert rc == 1 and "\n1 dump, 16 samples" in out
    assert err == "".join(
        f"nanscope scan: skipped {tmp_path}/{name}: {what}, not a regular file\n"
        for name, what in (("13.pt", "a FIFO"), ("14.pt", "a link to a character device"), ("15.pt", "a directory"),
                           ("16.pt", "a dangling link"))
    )  # fmt: skip
    (tmp_path / "12.pt").unlink()
    rc, _, err = run(capsys, str(tmp_path))
    assert (rc, err) == (
        2,
        f"nanscope scan: error: {tmp_path}: no *.pt dumps in this directory or below (4 named so are not regular "
        f"files: skipped {tmp_path}/13.pt: a FIFO, not a regular file)\n",
    )
    rc, _, err = run(capsys, "/proc")
    assert (rc, err) == (2, "nanscope scan: error: /proc: in /proc, a kernel file system whose reads can block or fail: "
                            "not read\n")  # fmt: skip


def test_file_text_in_the_tables_is_never_markup_nor_control_characters(tmp_path, capsys):
    """Issue 32 item 4: a reward key `[/]` crashed the directory scan (MarkupError: no --json, no --html), names like
    `[blink]x.pt` rendered as markup, an escape sequence in a file name reached the terminal."""
    names = ["[/]x.pt", "[blink]x.pt", "[link=https:example.com]click.pt", "a\x1b]0;title\x07b.pt"]
    for name in names:
        demo.write_demo(tmp_path / "d" / name)
    samples = [demo.rollout_sample(i, 4, 8, reward={"[/]": 1.0}) for i in range(4)]
    writers.write_rollout_dump(tmp_path / "d" / "keys.pt", samples, rollout_id=1)
    rc, out, err = run(capsys, str(tmp_path / "d"), "--workers", "1", "--json", str(tmp_path / "s.json"), "--progress")
    missing = f"{tmp_path}/d/keys.pt: reward of sample 0: a dict with keys ['[/]']; pass --reward-key"
    assert (rc, err.splitlines()[-1]) == (2, f"nanscope scan: error: 1 of 5 dumps failed; the first: {missing}")
    assert not any(c in out + err for c in "\x1b\x07")
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(" ") and line.split()}
    for name in ("[/]x.pt", "[blink]x.pt", "[link=https:example.com]click.pt", "a\\x1b]0;title\\x07b.pt"):
        assert rows[name].split()[1:3] == ["rollout", "v0.1.0"], out
    assert "a dict with keys ['[/]']" in out and len(json.loads((tmp_path / "s.json").read_text())["files"]) == 5
    rc, out, _ = run(capsys, str(tmp_path / "d" / "[/]x.pt"))
    assert rc == 1 and out.startswith(f"{tmp_path}/d/[/]x.pt: rollout dump, rollout 12, ")


@pytest.mark.parametrize(
    ("release", "kind", "line"),
    [
        ("v0.2.4", "rollout", "format: slime v0.2.4; 13 field(s) beyond v0.1.0's: generate_function_path, group_index, "
         "multimodal_inputs, multimodal_train_inputs, non_generation_time, prefix_cache_info, remove_sample, "
         "rollout_routed_experts, session_id, spec_info, teacher_log_probs, train_metadata, weight_versions; "
         "rollout_log_probs checked as float32"),
        ("v0.2.4", "train", "format: slime v0.2.4; rollout_log_probs checked as float32; told apart by "
         "rollout_log_probs' dtype"),
        ("v0.3.1", "train", "format: slime v0.3.1; 5 field(s) beyond v0.1.0's: global_batch_sizes, micro_batch_indices, "
         "num_microbatches, rollout_ids, rollout_mask_sums; rollout_log_probs checked as float32"),
        ("main", "train", "format: slime main; 5 field(s) beyond v0.1.0's: data_parallel_rank, rollout_ids, "
         "rollout_mask_sums, rollout_position, sample_index; 2 field(s) missing from v0.1.0's: raw_reward, "
         "sample_indices; rollout_log_probs checked as float32; format_version 2: one dict per sample, CP fields "
         "gathered whole"),
    ],
)  # fmt: skip
def test_each_release_s_format_through_argv(tmp_path, capsys, release, kind, line):
    dump = str(tmp_path / "d.pt")
    rc, out, _ = run(capsys, "--write-demo", dump, "--demo-kind", kind, "--demo-release", release)
    assert rc == 0 and out.splitlines()[0] == f"wrote {kind} dump {dump} (rollout 12, slime {release} format) with " + (
        "4 planted hazards:" if kind == "rollout" else "3 planted hazards:"
    )
    rc, out, err = run(capsys, dump, "--json", str(tmp_path / "s.json"))
    assert (rc, err) == (1, wrote(json=tmp_path / "s.json"))
    assert " ".join(out.split("\nhazards (")[0].split("\n", 1)[1].split()) == line  # wrapped between words
    doc = json.loads((tmp_path / "s.json").read_text())
    assert (doc["format"]["release"], doc["summary"]["verdict"].split(" would")[0]) == (release, f"slime {release}")


def test_a_directory_scan_says_each_file_it_scanned(tmp_path, capsys, monkeypatch):
    """Issue 42 item 3: `scan DIR` said nothing until it ended when piped; now one line a file on stderr (a bar
    above them on a terminal), none with --quiet; and its output fits 80 columns."""
    demo.write_demo(tmp_path / "12.pt")
    demo.write_demo(tmp_path / "13.pt", kind="train")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["scan", str(tmp_path), "--workers", "1"]) == 1
    out, err = capsys.readouterr()
    said = (
        f"nanscope scan: file 1 of 2: {tmp_path}/12.pt: 13 findings, would produce NaN: yes\n"
        f"nanscope scan: file 2 of 2: {tmp_path}/13.pt: 4 findings, would produce NaN: yes\n"
    )
    assert err.split() == said.split() and err.count("\nnanscope scan: ") == 1  # folded at 80: every word, 2 lines
    assert [line for line in err.splitlines() if len(line) > 80 and " " in line.strip()] == []
    assert max(map(len, out.splitlines())) <= 80 and "13.pt: train v0.1.0, 16 samples" in out
    assert main(["scan", str(tmp_path), "--workers", "1", "--quiet"]) == 1
    assert capsys.readouterr().err == ""


def test_the_legend_of_a_question_mark_comes_only_with_a_shown_one(tmp_path, capsys):
    """Issue 42 newcomer item 9: the legend explained a "?" no shown row had (the bounds were past --max-rows)."""
    dump = str(tmp_path / "12.pt")
    demo.write_demo(dump)
    legend = "?: bound only (the dump lacks one side of the log-ratio; see the note)"
    rc, out, _ = run(capsys, dump, "--max-rows", "1")
    assert rc == 1 and "?" not in out.split("\nchecks")[0] and legend not in out
    rc, out, _ = run(capsys, dump)
    assert rc == 1 and "kl-exp-overflow?" in out and legend in out
