"""Static parsing of launch scripts: arrays, expansions, arithmetic, seq, sources, placeholders, errors."""

from pathlib import Path

import pytest

from nanscope.errors import UserError
from nanscope.launch.script import parse_env, parse_script

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
    for w in argv[i + 1:]:
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
        ("scripts/slime_models/Qwen3-235B-A22B-Thinking-2507_model_args.sh", 15, "missing")]
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
    text = ("A=7\nB=(x y z)\nC=$(( (A + 2) % 4 * 3 - -1 ))\nD=$(( A / 2 ))\nE=$(( -7 / 2 ))\nF=$(( 2 ** 10 ))\n"
            'python3 t.py --c $C --d $D --e $E --f $F --b1 ${B[1]} --n ${#B[@]} --s "$A-${B[2]}"\n')
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
    s = parse_script(_script(tmp_path, 'N=${N:-4}\nA=1\nR=${R:-$((N - A))}\npython3 t.py --r $R\n'))
    assert s.argv == ["--r", "3"]


def test_script_is_never_executed(tmp_path):
    marker = tmp_path / "executed"
    text = f'touch {marker}\nX=$(touch {marker}.sub)\nsource <(touch {marker}.src)\npython3 t.py --x "$X"\n'
    s = parse_script(_script(tmp_path, text))
    assert not marker.exists() and not (tmp_path / "executed.sub").exists()
    assert s.argv == ["--x", f"$(touch {marker}.sub)"]
