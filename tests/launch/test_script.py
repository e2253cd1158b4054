"""Static parsing of launch scripts: arrays, expansions, arithmetic, seq, sources, placeholders, errors."""

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanscope.errors import UserError
from nanscope.launch.script import bounds, parse_env, parse_script

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "launch"
CASE = Path(__file__).resolve().parents[2] / "src" / "nanscope" / "cases" / "slime-795"


def _script(tmp_path, text: str) -> Path:
    path = tmp_path / "run.sh"
    path.write_text(text)
    return path


def _value(argv: list[str], flag: str) -> list[str]:
    """The words after `flag` up to the next --flag."""
    i = argv.index(flag)
    out = []
    for w in argv[i + 1 :]:
        if w.startswith("--"):
            break
        out.append(w)
    return out


def test_case_script_resolves_arrays_arithmetic_and_seq():
    s = parse_script(CASE / "launch.sh", {"TOTAL_NODES": "8"})
    assert s.train_script == "deepresearch/train.py"
    assert s.line == 134  # `ray job submit` starts on line 134
    assert s.launcher[:3] == ["ray", "job", "submit"] and s.launcher[-1] == "--"
    argv = s.argv
    assert argv[:6] == ["--actor-num-nodes", "8", "--actor-num-gpus-per-node", "8", "--rollout-num-gpus", "64"]
    assert _value(argv, "--update-weight-buffer-size") == [str(1024 * 1024 * 1024 * 4)]  # 4294967296
    assert _value(argv, "--rollout-max-response-len") == ["61440"]  # 65536 - 4096
    assert _value(argv, "--global-batch-size") == ["512"]  # NODES * 64
    assert _value(argv, "--rollout-batch-size") == ["64"]  # NODES * 8
    assert _value(argv, "--sglang-context-length") == ["65536"]  # PROMPT_LEN + RESPONSE_LEN
    # 1 2 4 8 then $(seq 16 8 256): 16, 24, ..., 256 is (256-16)/8+1 = 31 values
    bs = _value(argv, "--sglang-cuda-graph-bs")
    assert bs[:5] == ["1", "2", "4", "8", "16"] and bs[-1] == "256" and len(bs) == 4 + 31
    # the comment inside MISC_ARGS is not an argument; the last array ends the command
    assert "#" not in " ".join(argv) and argv[-2:] == ["--custom-rm-path", "deepresearch.reward.reward_func"]
    assert _value(argv, "--kl-loss-coef") == ["0.00"]


def test_case_script_reports_missing_source_and_unset_variables():
    s = parse_script(CASE / "launch.sh", {"TOTAL_NODES": "8"})
    assert [(x.path, x.line, x.status) for x in s.sources] == [
        ("scripts/slime_models/Qwen3-235B-A22B-Thinking-2507_model_args.sh", 15, "missing")
    ]
    assert s.unset_arrays == ["MODEL_ARGS", "DISTRIBUTED_ARGS"]
    assert {"SHARED_STORAGE_DATA", "WANDB_API_KEY", "MASTER_ADDR"} <= set(s.unset)
    # unset scalars stay visible as their own text
    assert _value(s.argv, "--wandb-key") == ["$WANDB_API_KEY"]
    assert _value(s.argv, "--load") == ["$SHARED_STORAGE_DATA/slime-ckpt/Qwen3-235B-A22B-Thinking-2507_slime_v1.5/"]
    assert s.syntax_errors == []
    assert s.assumptions == ['line 9: `[ "$NVLINK_COUNT" -gt 0 ]` is not known statically; assumed true']


def test_case_script_without_total_nodes_keeps_arithmetic_placeholder():
    s = parse_script(CASE / "launch.sh")
    assert _value(s.argv, "--actor-num-nodes") == ["$((NODES))"]
    assert "TOTAL_NODES" in s.unset


def test_colocated_qwen3_4b_follows_script_dir_source():
    s = parse_script(FIXTURES / "qwen3_4b_colocate.sh")
    assert s.train_script == "train.py"
    assert [x.status for x in s.sources] == ["followed"]
    assert s.sources[0].path.endswith("fixtures/launch/models/qwen3-4B.sh")
    assert _value(s.argv, "--num-layers") == ["36"]
    assert _value(s.argv, "--normalization") == ["RMSNorm"]  # quotes removed
    assert _value(s.argv, "--hf-checkpoint") == ["/root/Qwen3-4B"]  # the commented-out FP8 line is skipped
    assert s.launcher[3] == "--address=http://127.0.0.1:8265"  # ${MASTER_ADDR:-"127.0.0.1"}
    assert s.unset_arrays == ["DISTRIBUTED_ARGS"]


def test_disaggregated_quoted_arrays_append_and_defaults():
    s = parse_script(FIXTURES / "disaggregated_moe.sh", {"ACTOR_NODES": "2", "MASTER_ADDR": "10.0.0.1"})
    assert s.launcher == ["ray", "job", "submit", "--address=http://10.0.0.1:8265", "--"]
    assert _value(s.argv, "--actor-num-nodes") == ["2"]
    # "${LOSS_ARGS[@]}" is one word per element, += appended the reward path
    assert _value(s.argv, "--custom-rm-path") == ["my_project.reward.score"]
    assert _value(s.argv, "--moe-layer-freq") == ["'([1]*48)'"]
    assert _value(s.argv, "--rollout-max-response-len") == ["8192"]  # $(( PROMPT_LEN * 4 ))
    assert _value(s.argv, "--load") == ["$CKPT_DIR"]  # unset: kept as text
    assert s.argv.count("--num-layers") == 1 and "2>&1" not in s.argv


def test_env_default_expansion_uses_env_over_default():
    # ${ACTOR_NODES:-2} with --env ACTOR_NODES=4
    s = parse_script(FIXTURES / "disaggregated_moe.sh", {"ACTOR_NODES": "4"})
    assert _value(s.argv, "--actor-num-nodes") == ["4"]


def test_vpp_conditions_seq_and_command_placeholder():
    s = parse_script(FIXTURES / "vpp_dense.sh")
    assert s.launcher == [] and s.train_script == "train.py"
    assert _value(s.argv, "--num-layers-per-virtual-pipeline-stage") == ["2"]  # 16 / 4 / 2
    assert _value(s.argv, "--sglang-cuda-graph-bs") == ["1", "2", "3"]
    assert "--debug-train-only" not in s.argv  # [[ -n "$DEBUG" ]] is false: DEBUG unset
    assert _value(s.argv, "--wandb-key") == ["$(cat ~/.wandb_key)"]
    assert [p.text for p in s.placeholders] == ["$(cat ~/.wandb_key)"]
    with_debug = parse_script(FIXTURES / "vpp_dense.sh", {"DEBUG": "1"})
    assert "--debug-train-only" in with_debug.argv


def test_model_args_file_stands_in_for_missing_source(tmp_path):
    path = _script(tmp_path, 'source "missing/model.sh"\npython3 train.py ${MODEL_ARGS[@]} --lr 1e-6\n')
    s = parse_script(path, model_args=str(FIXTURES / "models" / "qwen3-4B.sh"))
    assert s.sources[0].status == "followed"
    assert _value(s.argv, "--num-layers") == ["36"] and s.argv[-2:] == ["--lr", "1e-6"]


def test_arithmetic_operators_and_indexing(tmp_path):
    text = (
        "A=7\nB=(x y z)\nC=$(( (A + 2) % 4 * 3 - -1 ))\nD=$(( A / 2 ))\nE=$(( -7 / 2 ))\nF=$(( 2 ** 10 ))\n"
        'python3 t.py --c $C --d $D --e $E --f $F --b1 ${B[1]} --n ${#B[@]} --s "$A-${B[2]}"\n'
    )
    s = parse_script(_script(tmp_path, text))
    # (7+2)%4*3 - -1 = 1*3+1 = 4; 7/2 = 3; -7/2 truncates to -3 as in bash; 2**10 = 1024
    assert s.argv == ["--c", "4", "--d", "3", "--e", "-3", "--f", "1024", "--b1", "y", "--n", "3", "--s", "7-z"]


def test_python_options_before_script_and_last_command_wins(tmp_path):
    text = "python3 first.py --a 1\npython -u second.py --b 2\n"
    s = parse_script(_script(tmp_path, text))
    assert (s.train_script, s.argv, s.line) == ("second.py", ["--b", "2"], 2)


def test_unreadable_script_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"nope\.sh: launch script: no such file$"):
        parse_script(tmp_path / "nope.sh")


def test_no_train_command_is_a_user_error():
    with pytest.raises(UserError, match=r"no_train_command\.sh: no train command found"):
        parse_script(FIXTURES / "no_train_command.sh")


def test_parse_env():
    assert parse_env(["TOTAL_NODES=8", "A=b=c"]) == {"TOTAL_NODES": "8", "A": "b=c"}
    with pytest.raises(UserError, match="--env 'TOTAL_NODES': expected NAME=VALUE"):
        parse_env(["TOTAL_NODES"])


def test_arithmetic_inside_default_value(tmp_path):
    # tree-sitter-bash parses `${R:-$((N - A))}` as a command substitution of a subshell; it is re-read
    s = parse_script(_script(tmp_path, "N=${N:-4}\nA=1\nR=${R:-$((N - A))}\npython3 t.py --r $R\n"))
    assert s.argv == ["--r", "3"]


def test_script_is_never_executed(tmp_path):
    marker = tmp_path / "executed"
    text = f'touch {marker}\nX=$(touch {marker}.sub)\nsource <(touch {marker}.src)\npython3 t.py --x "$X"\n'
    s = parse_script(_script(tmp_path, text))
    assert not marker.exists() and not (tmp_path / "executed.sub").exists()
    assert s.argv == ["--x", f"$(touch {marker}.sub)"]


def _x(tmp_path, lines: str) -> tuple[str, list[str]]:
    """The value `--x "$X"` reads after `lines`, and the script's limit notes."""
    s = parse_script(_script(tmp_path, lines + 'python3 t.py --x "$X"\n'))
    return s.argv[1], s.limits


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("010 + 0x1f + 0X1F", 8 + 31 + 31),
        ("2#101 + 8#17 + 16#ff + 36#Z + 36#z", 5 + 15 + 255 + 35 + 35),
        ("64#zz + 64#_ + 64#@ + 64#A", 35 * 64 + 35 + 63 + 62 + 36),
        ("10#08", 8),
        ("0x", 0),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775807 - 1", -(2**63)),
        ("1 << 62", 2**62),
        ("-7 / 2", -3),
        ("-7 % 2", -1),
        ("3 ** 39", 3**39),
        ("-8 >> 63", -1),
    ],
)
def test_bash_numbers(tmp_path, expr, value):
    assert _x(tmp_path, f"X=$(( {expr} ))\n") == (str(value), [])


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("08 + 1", "08: value too great for base"),
        ("2#2", "2#2: value too great for base"),
        ("65#1", "65#1: invalid arithmetic base"),
        ("1#1", "1#1: invalid arithmetic base"),
        ("1 / 0", "division by 0"),
        ("5 % 0", "division by 0"),
        ("2 ** -1", "exponent less than 0"),
        ("1 << -1", "shift count -1 is outside 0..63"),
        ("5 >> 64", "shift count 64 is outside 0..63"),
        ("9223372036854775808", "overflows bash's signed 64-bit arithmetic"),
        ("9" * 5000, "overflows bash's signed 64-bit arithmetic"),
        ("1 << 99999999999", "shift count 99999999999 is outside 0..63"),
        ("1 << 63", "overflows bash's signed 64-bit arithmetic"),
        ("3 ** 99999999999", "overflows bash's signed 64-bit arithmetic"),
        ("9223372036854775807 + 1", "overflows bash's signed 64-bit arithmetic"),
    ],
)
def test_what_bash_rejects_or_overflows_is_kept_as_text_with_a_note(tmp_path, expr, reason):
    text = f"$(( {expr} ))"
    shown = text if len(text) <= 200 else text[:200] + "..."
    assert _x(tmp_path, f"X={text}\n") == (shown, [f"line 1: `{shown}`: {reason}; kept as text"])


def test_caps_keep_the_value_as_text_and_the_rest_reads(tmp_path):
    value, limits = _x(tmp_path, "X=$(seq 1 10000000000)\nY=$(seq 3)\n")
    assert value == "$(seq 1 10000000000)"
    assert limits == [
        "line 1: `$(seq 1 10000000000)`: `seq` gives 10,000,000,000 numbers, more than 65,536; kept as text"
    ]
    # doubling: 2 chars x 2^19 = 1 Mi characters is the last that fits; the next is kept as text, then it grows again
    value, limits = _x(tmp_path, "X=ab\n" + 'X="$X$X"\n' * 20)
    assert value == '"$X$X"' and limits == [
        'line 21: `"$X$X"`: longer than 1,048,576 characters or 65,536 words; kept as text'
    ]
    s = parse_script(_script(tmp_path, "X=(a b)\n" + 'X=("${X[@]}" "${X[@]}")\n' * 15 + "python3 t.py --n ${#X[@]}\n"))
    assert s.argv == ["--n", "65536"] and s.limits == []  # 2 x 2^15 words: at the cap, not over
    s = parse_script(_script(tmp_path, "X=(a b)\n" + 'X=("${X[@]}" "${X[@]}")\n' * 16 + "python3 t.py --n ${#X[@]}\n"))
    assert s.argv == ["--n", str(len('("${X[@]}" "${X[@]}")'))] and len(s.limits) == 1


@pytest.mark.parametrize(("left", "right"), [("$(", ")"), ("$((", "))"), ("${A:-", "}"), ("$(echo ", ")")])
def test_nesting_past_the_cap_is_kept_as_text(tmp_path, left, right):
    start = time.process_time()
    value, _ = _x(tmp_path, f'X="{left * 5000}1{right * 5000}"\n')
    assert value.startswith(left * 3) and value.endswith("...")
    assert time.process_time() - start < 10  # a hang check (CPU s), not a speed: the cap makes it well under 1
    assert _x(tmp_path, f'X="{left * 20}1{right * 20}"\n')[1] == []  # 20 deep reads


def test_nesting_past_the_cap_is_noted():
    s = parse_script(CASE / "launch.sh", {"TOTAL_NODES": "8"})
    assert s.limits == []


def test_a_script_of_too_many_statements_stops_with_a_hint(tmp_path, monkeypatch):
    monkeypatch.setattr(bounds, "MAX_STEPS", 3000)  # each `a=1` is 3 steps: the statement, the value, its word
    path = _script(tmp_path, "a=1\n" * 2000 + "python3 t.py\n")
    with pytest.raises(
        UserError,
        match=r"no train command found: .* \(reading stopped at line 1001: more than "
        r"3,000 statements, words and operations\)$",
    ):
        parse_script(path)


def test_a_file_over_the_limit_is_refused_and_the_limit_can_be_raised(tmp_path):
    path = _script(tmp_path, "# padding\n" * 200 + "python3 t.py --x 1\n")
    with pytest.raises(
        UserError,
        match=r"run\.sh: launch script: 2019 bytes is over the 1024 bytes limit "
        r"\(raise it with --max-input-mb\)$",
    ):
        parse_script(path, limit=1024)
    assert parse_script(path, limit=4096).argv == ["--x", "1"]


OPERATORS = ["+", "-", "*", "/", "%", "<<", ">>", "**", "&", "|", "^", "<", ">", "<=", ">=", "==", "!=", "&&", "||"]


def _constant() -> st.SearchStrategy[str]:
    digits = "0123456789abcdefxyzABCXYZ@_"
    return st.one_of(
        st.integers(0, 2**70).map(str),
        st.text("01234567", min_size=1, max_size=25).map(lambda s: "0" + s),
        st.text("0123456789abcdefABCDEF", min_size=1, max_size=18).map(lambda s: "0x" + s),
        st.tuples(st.integers(1, 66), st.text(digits, min_size=1, max_size=12)).map(lambda t: f"{t[0]}#{t[1]}"),
        st.text("0123456789", min_size=1, max_size=4),
    )


def _expression() -> st.SearchStrategy[str]:
    return st.recursive(
        _constant(),
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(OPERATORS), inner).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            inner.map(lambda e: f"( {e} )"),
            inner.map(lambda e: f"-{e}"),
            inner.map(lambda e: f"~{e}"),
        ),
        max_leaves=4,
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare with")
@settings(max_examples=150, deadline=None)
@given(expr=_expression())
def test_arithmetic_agrees_with_bash(tmp_path_factory, expr):
    """A number we compute is bash's number; where bash stops with an error, we keep the text with a note."""
    bash = subprocess.run(["bash", "-c", f"echo $(( {expr} ))"], capture_output=True, text=True, timeout=10)
    value, limits = _x(tmp_path_factory.mktemp("arith"), f"X=$(( {expr} ))\n")
    if re.fullmatch(r"-?\d+", value):
        assert bash.returncode == 0 and bash.stdout.strip() == value, (expr, bash.stderr)
    elif bash.returncode != 0:
        assert limits, (expr, bash.stderr)
