"""verl's and OpenRLHF's loss code per release (facts.peer_code), checked against their own code at each cited tag:
every cited span holds the exp, and the clamp comes before it exactly where the table says the defect is absent.

    NANSCOPE_TEST_VERL_GIT=/path/to/verl/.git NANSCOPE_TEST_OPENRLHF_GIT=/path/to/OpenRLHF/.git pytest tests/facts
"""

import os
import re
import subprocess

import pytest

from nanscope.facts import frameworks, peer_code

GITS = {
    frameworks.VERL: os.environ.get("NANSCOPE_TEST_VERL_GIT"),
    frameworks.OPENRLHF: os.environ.get("NANSCOPE_TEST_OPENRLHF_GIT"),
}
_CITES = re.compile(r"((?::\d+(?:-\d+)?(?:, )?)+) \((v[\d.]+)")


def _cites(defect: peer_code.Defect) -> list[tuple[str, int, int]]:
    """(release, first line, last line) of each span `where` cites."""
    out = []
    for spans, release in _CITES.findall(defect.where):
        for first, last in re.findall(r":(\d+)(?:-(\d+))?", spans):
            out.append((release, int(first), int(last or first)))
    return out


def test_every_defect_cites_lines_at_a_release_inside_its_span():
    for defect in peer_code.DEFECTS:
        cites = _cites(defect)
        assert cites, defect
        assert all(peer_code.in_span(defect, release) for release, _, _ in cites), defect


def test_the_releases_spans_decide():
    verl_kl = peer_code.defects(frameworks.VERL, "kl-exp-overflow")
    assert [(d.first, d.last, d.present) for d in verl_kl] == [(None, "v0.4.0", True), ("v0.4.1", None, False)]
    assert [peer_code.in_span(d, "v0.4.0") for d in verl_kl] == [True, False]
    assert [peer_code.in_span(d, "v0.9.0") for d in verl_kl] == [False, True]
    ratio = peer_code.defects(frameworks.OPENRLHF, "ratio-exp-overflow")
    assert [peer_code.in_span(d, "v0.10.2") for d in ratio] == [True, False]
    assert [peer_code.in_span(d, "v0.10.3") for d in ratio] == [False, True]
    assert all(d.present for d in peer_code.defects(frameworks.OPENRLHF, "kl-exp-overflow"))  # k3: exp first, always


AT_HAND = [d for d in peer_code.DEFECTS if GITS[d.framework]]
NO_CLONE = sorted({d.framework for d in peer_code.DEFECTS} - {d.framework for d in AT_HAND})


@pytest.mark.skipif(not NO_CLONE, reason="every framework's clone is at hand")
def test_the_frameworks_without_a_clone_at_hand_are_named():
    pytest.skip(f"no {' or '.join(NO_CLONE)} clone (NANSCOPE_TEST_VERL_GIT / NANSCOPE_TEST_OPENRLHF_GIT)")


@pytest.mark.parametrize("defect", AT_HAND, ids=lambda d: f"{d.framework}-{d.cause}-{d.first}-{d.last}")
def test_the_cited_code_says_so(defect):
    git = GITS[defect.framework]
    path = defect.where.split(":", 1)[0]
    for release, first, last in _cites(defect):
        source = subprocess.run(["git", "--git-dir", git, "show", f"{release}:{path}"], capture_output=True, text=True)
        assert source.returncode == 0, (release, path)
        lines = source.stdout.splitlines()[first - 1 : last]
        exp = next(i for i, line in enumerate(lines) if "exp(" in line or ".exp()" in line)
        clamps = [i for i, line in enumerate(lines) if "clamp" in line]
        clamped_first = bool(clamps) and clamps[0] < exp
        assert clamped_first == (not defect.present), (release, first, last, lines)
