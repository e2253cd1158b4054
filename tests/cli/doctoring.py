"""doctor on a crafted log (and launch script), in process: its JSON and its terminal text with the box's rules and
runs of spaces folded, for tests that assert what one class of line reads as."""

from __future__ import annotations

import json

from nanscope.cli.main import main


def doctor_log(tmp_path, capsys, log: str, script: str | None = None) -> tuple[dict, str]:
    """Write `log` (and `script`) under tmp_path, run doctor with --json; exit 0 asserted."""
    (tmp_path / "job.log").write_text(log)
    out = tmp_path / "d.json"
    args = ["doctor", "--traceback", str(tmp_path / "job.log"), "--json", str(out)]
    if script is not None:
        (tmp_path / "train.sh").write_text(script)
        args.insert(1, str(tmp_path / "train.sh"))
    code = main(args)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text()), " ".join(captured.out.replace("│", " ").split())


def refused_script(tmp_path, capsys, script: str) -> str:
    """Write `script` as the launch script alone and run doctor: exit 2 and one line on stderr asserted; that line."""
    (tmp_path / "train.sh").write_text(script)
    assert main(["doctor", str(tmp_path / "train.sh")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err
