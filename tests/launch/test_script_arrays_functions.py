"""Associative arrays and the script's own functions, read as bash reads them (issue 24, item 7).

Each script is also run by bash itself (when it is installed) with `python3` a function that prints its
arguments: the reader's argument list must be bash's, word for word. Nothing of the script is executed by the
reader; bash runs it here only as the reference.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from nanscope.errors import UserError
from nanscope.launch.script import parse_script

ASSOCIATIVE = """\
declare -A M=([tp]=2 [pp]=4 [ep]=8)
M[cp]=2
M[tp]+=0
K=pp
N=$(( M[cp] * 3 + ${M[$K]} ))
declare -A P=(etp 1 edp 2)
python3 train.py --tensor-model-parallel-size ${M[tp]} --pipeline-model-parallel-size "${M[$K]}" \\
  --context-parallel-size ${M[cp]} --values "${M[@]}" --keys ${!M[@]} --count ${#M[@]} --n $N \\
  --p ${P[etp]} "${P[edp]}" --missing "${M[nope]}" --first $M
"""

FUNCTIONS = """\
NODES=2
args() {
  local extra=$1
  shift
  ARGS=(--actor-num-nodes "$NODES" "$@" $extra)
}
launch() {
  local tp=$1
  local -A SIZES=([pp]=2)
  [ -n "$tp" ] || return 1
  args "--lr 1e-6" --tensor-model-parallel-size "$tp" --pipeline-model-parallel-size ${SIZES[pp]}
  python3 train.py "${ARGS[@]}" --count $# --all "$*" --tp-after-call $tp
  return 0
  python3 other.py --never-read
}
tp=9
launch 4 y
python3 train.py --tp-outside "$tp" --extra "${ARGS[@]}"
"""


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.sh"
    path.write_text(text)
    return path


def _bash_argvs(path: Path) -> list[list[str]]:
    """Every `python3 ...` command bash runs in the script: its words after `python3`."""
    stub = 'python3() { printf "%s\\0" "$@"; printf "\\n"; }; source "$1"'
    proc = subprocess.run(["bash", "-c", stub, "bash", str(path)], capture_output=True, timeout=10)
    assert proc.returncode == 0, proc.stderr
    return [line.split(b"\0")[:-1] for line in proc.stdout.split(b"\n")[:-1]]


def test_associative_arrays_read_as_bash_reads_them(tmp_path):
    path = _script(tmp_path, ASSOCIATIVE)
    script = parse_script(path)
    assert script.argv == [
        "--tensor-model-parallel-size",
        "20",
        "--pipeline-model-parallel-size",
        "4",
        "--context-parallel-size",
        "2",
        "--values",
        "4",
        "2",
        "20",
        "8",
        "--keys",
        "pp",
        "cp",
        "tp",
        "ep",
        "--count",
        "4",
        "--n",
        "10",
        "--p",
        "1",
        "2",
        "--missing",
        "",
        "--first",
    ]  # fmt: skip  (bash's order of the keys, not the order they were written in)
    assert script.placeholders == [] and script.unset == {} and script.limits == []
    assert script.variables["M"] == {"tp": "20", "pp": "4", "ep": "8", "cp": "2"}
    if shutil.which("bash"):
        assert [["train.py", *script.argv]] == [[word.decode() for word in argv] for argv in _bash_argvs(path)]


def test_a_train_command_inside_a_called_function_reads_with_its_arguments(tmp_path):
    path = _script(tmp_path, FUNCTIONS)
    script = parse_script(path)
    # the last train command: after the call, whose locals (tp) are restored and whose global (ARGS) stays
    assert (script.train_script, script.line) == ("train.py", 18)
    assert script.argv == ["--tp-outside", "9", "--extra", "--actor-num-nodes", "2", "--tensor-model-parallel-size",
                           "4", "--pipeline-model-parallel-size", "2", "--lr", "1e-6"]  # fmt: skip
    if shutil.which("bash"):
        ran = [[word.decode() for word in argv] for argv in _bash_argvs(path)]
        assert ran[-1] == ["train.py", *script.argv]
        assert ran[0] == [
            "train.py", "--actor-num-nodes", "2", "--tensor-model-parallel-size", "4",
            "--pipeline-model-parallel-size", "2", "--lr", "1e-6", "--count", "2", "--all", "4 y",
            "--tp-after-call", "4",
        ]  # fmt: skip
    # the same call as the script's last command: the train command is the one inside the function
    inside = parse_script(_script(tmp_path, FUNCTIONS.rsplit("python3 train.py --tp-outside", 1)[0]))
    assert inside.line == 12 and inside.argv[-6:] == ["--count", "2", "--all", "4 y", "--tp-after-call", "4"]


def test_a_recursive_function_stops_with_a_note_and_an_uncalled_one_is_named(tmp_path):
    recursive = parse_script(_script(tmp_path, "f() { f; }\nf\npython3 train.py --x 1\n"))
    assert recursive.argv == ["--x", "1"]
    assert recursive.limits == ["line 1: `f`: function calls nested more than 32 deep: not read"]
    with pytest.raises(UserError) as refused:
        parse_script(_script(tmp_path, "main() {\n  python3 train.py --x 1\n}\n"))
    assert str(refused.value).endswith(
        "directly or after `ray job submit ... --` (defined but never called: `main` (line 1), which run python)"
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare with")
def test_associative_order_is_bash_order(tmp_path):
    from nanscope.launch.script.arrays import bash_order  # here: the other tests also run on the code before it

    keys = [f"{a}{b}" for a in "tpcedxyz" for b in ("", "_size", "-1", "é")][:30] + ["日本", "a b"]
    body = " ".join(f'M["{key}"]=1;' for key in keys)
    proc = subprocess.run(
        ["bash", "-c", f'declare -A M; {body} printf "%s\\n" "${{!M[@]}}"'], capture_output=True, text=True, timeout=10
    )
    assert proc.stdout.splitlines() == bash_order(keys)
