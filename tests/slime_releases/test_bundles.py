"""Every release: a bundle written through that slime checkout's own loss (observed by the plugin's loss watch,
bundle_worker.py) replays offline through the same checkout (`nanscope trace DIR --slime-src`) and names the same
op, source line, sample and token as the in-process trace of the same call, at CP 1 and on each rank of CP 2.

Needs NANSCOPE_SLIME_SRC (one checkout per tag; tests/checkouts.py). zero-temperature's op is the log-prob
helper's division of the logits by 0, before the recorded log-probs: offline, the replay names the non-finite
inputs instead (class data). The README's table "The loss hazards offline, per release" is this test's result.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nanscope.cli.main import main
from tests.checkouts import RELEASES, SLIME_SRC, slime_release

pytestmark = pytest.mark.usefixtures("wide_lines")  # trace's lines asserted whole

WORKER = Path(__file__).with_name("bundle_worker.py")
KEYS = ("op", "source", "node", "sample", "token", "masked")


@pytest.fixture(scope="module", params=RELEASES)
def replayed(request, tmp_path_factory):
    """(release, in-process records by bundle name, offline replays by bundle name, the bundles' directory)."""
    checkout = slime_release(request.param)
    out = tmp_path_factory.mktemp(request.param)
    cmd = [sys.executable, str(WORKER), "--slime-src", str(checkout), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    in_process = json.loads((out / "inprocess.json").read_text())["records"]
    assert main(["trace", str(out), "--slime-src", str(SLIME_SRC), "--json", str(out / "offline.json")]) == 1
    offline = {Path(b["source"]).name: b for b in json.loads((out / "offline.json").read_text())["bundles"]}
    return request.param, in_process, offline, out


@pytest.mark.timeout(600)
def test_each_release_replays_its_own_bundles_as_it_traced_them(replayed):
    release, in_process, offline, _ = replayed
    assert set(offline) == set(in_process)
    for name, want in in_process.items():
        got = offline[name]
        assert got["release_loss"] and got["loss"].startswith(f"slime {release}"), got["loss"]
        first = got["first"]
        guards = [e["guard"] for e in got["microbatches"]]
        if name.startswith("zero-temperature"):  # its fix is the flag: no guard makes a NaN policy finite
            assert want["forward"]["op"] == "aten.div.Tensor" and first["forward"] is None
            assert got["class"] == "data", name
            continue
        assert all(g["loss_finite"] and g["grad_nonfinite"] == 0 for g in guards), name
        for phase in ("forward", "backward"):
            if want[phase] is None:
                assert first[phase] is None, (name, phase)
            else:
                assert {k: first[phase][k] for k in KEYS} == {k: want[phase][k] for k in KEYS}, (name, phase)
        finite = want["loss_finite"] and want["grad_nonfinite"] == 0
        assert got["found"] is not finite, name  # a CP rank without the hazard's token replays finite


def test_a_bundle_of_another_release_is_refused_in_one_line(replayed, capsys):
    release, _, _, out = replayed
    other = next(r for r in RELEASES if r != release)
    path = out / "kl-exp-overflow_cp1_rank0.bundle.pt"
    assert main(["trace", str(path), "--slime-src", str(slime_release(other))]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"nanscope trace: error: the bundle was written through slime {release}, but the slime here (checkout "
    ) and err.endswith("give that release's checkout with --slime-src\n")
