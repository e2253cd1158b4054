"""Issue 41: every stack's NaN evidence, read as evidence (item 1); metric lines of every stack, with which model and
which metric went non-finite first (item 2); what can be read is read and what cannot is said (item 3). One test a
class of the issue's "Why"; each failed on the code before (exit 2, "no Megatron error found", or a wrong answer).
The texts are written in each stack's format with our own hosts and values."""

import json
from pathlib import Path

import pytest

from nanscope.cli.main import main

REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"


pytestmark = pytest.mark.usefixtures("wide_terminal")


def _doctor(tmp_path, capsys, text: str, *extra: str, name: str = "job.log") -> tuple[dict, str]:
    log = tmp_path / name
    log.write_text(text)
    out = tmp_path / "d.json"
    code = main(["doctor", *extra, "--traceback", str(log), "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text()), " ".join(captured.out.split())


def _summary(doc: dict, *keys: str) -> tuple:
    return tuple(doc["summary"][key] for key in keys)


OVERFLOW = (
    "{'loss': 2.31, 'grad_norm': 4.5, 'learning_rate': 2e-05, 'epoch': 0.01}\n"
    "[2025-03-01 10:00:01,001] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
    "Attempted loss scale: 65536, reducing to 32768\n"
    "{'loss': 2.29, 'grad_norm': 4.5, 'learning_rate': 2e-05, 'epoch': 0.02}\n"
)


def test_deepspeed_overflow_is_evidence_and_the_grad_norm_after_it_is_stale(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, OVERFLOW)
    assert (doc["failure"]["format"], doc["failure"]["check"], doc["failure"]["rank"]) == (
        "signal",
        "deepspeed-overflow",
        None,  # DeepSpeed's `Rank 0` is the rank that logs it
    )
    assert doc["failure"]["other_ranks"] == ["rank 0 logs it (DeepSpeed prints it on rank 0 only)"]
    assert doc["framework"]["name"] == "transformers"  # its Trainer's dicts; DeepSpeed is the library it calls
    assert doc["signals"]["stale_grad_norm"] == {"line": 3, "value": "4.5", "before_overflow": "4.5"}
    assert "grad_norm 4.5 at line 3 is the skipped step's, so the previous step's" in out


def test_the_minimum_loss_scale_exception_alone(tmp_path, capsys):
    doc, _ = _doctor(
        tmp_path,
        capsys,
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n",
    )
    assert (doc["summary"]["check"], doc["framework"]["name"], doc["failure"]["fatal"]) == (
        "loss-scale-minimum",
        "deepspeed",
        True,
    )


def test_an_anomaly_mode_error_names_the_backward_function_and_output(tmp_path, capsys):
    doc, out = _doctor(
        tmp_path, capsys, "RuntimeError: Function 'Log1PBackward0' returned nan values in its 0th output.\n"
    )
    assert _summary(doc, "check", "kind", "op") == ("anomaly-nan", "NaN", "Log1PBackward0")
    assert doc["failure"]["output"] == 0
    assert "Log1PBackward0, output 0" in out


SAMPLING = "".join(
    f"[rank5]: {line}\n"
    for line in (
        "Traceback (most recent call last):",
        '  File "/workspace/verl/verl/workers/rollout/hf_rollout.py", line 120, in generate_sequences',
        "    output = self.module.generate(**kwargs)",
        '  File "/usr/local/lib/python3.10/site-packages/transformers/generation/utils.py", line 3290, in _sample',
        "    next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)",
        "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0",
    )
)


def test_a_sampling_assert_with_rank_prefixes_gives_the_rank_frames_and_model(tmp_path, capsys):
    """Before: no rank, and "the traceback ends before its error line"."""
    doc, _ = _doctor(tmp_path, capsys, SAMPLING)
    assert _summary(doc, "rank", "check", "model") == (5, "probability-assert", "policy")
    assert doc["framework"]["name"] == "verl" and len(doc["frames"]) == 2


def test_a_watchdog_timeout_names_no_failing_rank(tmp_path, capsys):
    text = "".join(
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL("
        f"SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds\n"
        for r in (3, 1)
    )
    doc, out = _doctor(tmp_path, capsys, text)
    assert _summary(doc, "rank", "check", "op") == (None, "nccl-timeout", "ALLREDUCE")
    assert doc["signals"]["waiting_ranks"] == [1, 3]
    assert "ranks left waiting in a collective: 3, 1 (not the failing rank)" in out


def test_any_error_line_naming_nan_with_a_rank_prefix(tmp_path, capsys):
    """`[rank127]: RuntimeError: [NaN ...` exited 2: "no Megatron error found"."""
    doc, _ = _doctor(tmp_path, capsys, "[rank127]: RuntimeError: [NaN detected in grad of layer 12]\n")
    assert _summary(doc, "rank", "check", "op") == (127, "nonfinite-error", "RuntimeError")


def test_a_traceback_through_nemo_frames_gives_the_rank_from_its_prefixes(tmp_path, capsys):
    text = "".join(
        f"[rank29]: {line}\n"
        for line in (
            "Traceback (most recent call last):",
            '  File "/opt/NeMo/nemo/lightning/pytorch/strategies/megatron_strategy.py", line 618, in training_step',
            "    out = self.model.training_step(dataloader_iter, *args, **kwargs)",
            '  File "/opt/megatron-lm/megatron/core/pipeline_parallel/schedules.py", line 641, in '
            "forward_backward_no_pipelining",
        )
    )
    doc, out = _doctor(tmp_path, capsys, text)
    assert (doc["summary"]["rank"], doc["framework"]["name"]) == (29, "nemo")
    assert "The traceback (rank 29's: its lines' [rank29]: prefixes) ends before its error line" in out


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (  # TRL's DPO dict: only grad_norm was read; NaN log-probs gave no finding
            "{'loss': 0.0, 'grad_norm': 1.2, 'rewards/chosen': nan, 'rewards/rejected': nan, 'logps/rejected': nan, "
            "'logps/chosen': nan, 'epoch': 0.1}\n",
            ("rewards/chosen", "policy", None, "trl"),
        ),
        (  # verl: "grad_norm left its range at step 1" pointed at the policy; the critic failed
            "step:1 - actor/grad_norm:9.8 - actor/pg_loss:0.12 - critic/vf_loss:nan - critic/grad_norm:nan\n",
            ("critic/vf_loss", "critic", 1, "verl"),
        ),
        (  # verl logs its data metrics under `critic/` too: a NaN score is the reward's, not the value model's
            "step:2 - critic/score/mean:nan - critic/rewards/mean:nan - actor/pg_loss:0.1 - critic/vf_loss:0.2\n",
            ("critic/score/mean", "reward", 2, "verl"),
        ),
        (  # NeMo AutoModel's `|` steps: step 10 was found, the NaN at step 11 never reported
            "step 10 | epoch 0 | loss 2.1 | grad_norm 3.3\nstep 11 | epoch 0 | loss nan | grad_norm nan\n",
            ("loss", None, 11, "unknown"),
        ),
        (  # ms-swift's JSON lines: NaN spelled as json.dumps writes it
            '{"loss": 0.2, "grad_norm": 0.01, "reward": 1.5, "reward_std": 0.2, "kl": NaN, '
            '"global_step/max_steps": "300/1296"}\n',
            ("kl", None, 300, "ms-swift"),
        ),
        (  # InternEvo's skip counter
            "INFO pipeline.py:770 in record_current_batch_training_metrics -- step=642 loss=2.17 grad_norm="
            "{'0_default': 2.15} inf_nan_skip_batches=3 acc=0.55\n",
            ("inf_nan_skip_batches", None, None, "internevo"),
        ),
    ],
    ids=["trl-dpo-logps", "verl-critic", "verl-data-metrics", "automodel-pipes", "ms-swift-json", "internevo-counter"],
)
def test_which_model_and_which_metric_first(text, want, tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, text)
    assert (*_summary(doc, "metric", "model", "step"), doc["framework"]["name"]) == want


MEGATRON = (
    " iteration        4/    10 | consumed samples:           16 | elapsed time per iteration (ms): 1979.2 | "
    "learning rate: 4.2E-07 | global batch size:    4 | lm loss: 1.1E+01 | loss scale: 1.0 | grad norm: 2.1 | "
    "number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    " iteration        5/    10 | consumed samples:           20 | elapsed time per iteration (ms): 1979.2 | "
    "learning rate: 4.2E-07 | global batch size:    4 | loss scale: 1.0 | grad norm: nan | "
    "number of skipped iterations:   0 | number of nan iterations:   0 |\n"
)


def test_megatrons_iteration_line_without_its_lm_loss_is_a_nan_loss(tmp_path, capsys):
    """The loss is printed only when its average is > 0; the nan counter stays 0."""
    doc, out = _doctor(tmp_path, capsys, MEGATRON)
    # round 2 (class j): a printed NaN outranks a loss Megatron did not print, which comes after it
    assert (*_summary(doc, "metric", "step"), doc["framework"]["name"]) == ("grad norm", 5, "megatron-lm")
    assert doc["metrics"]["first_nonfinite"]["values"] == [["grad norm", "nan"], ["lm loss", "missing"]]


def test_a_wrapped_iteration_line(tmp_path, capsys):
    head, tail = MEGATRON.splitlines()[1].split(" loss scale:")
    doc, _ = _doctor(tmp_path, capsys, MEGATRON.splitlines()[0] + "\n" + head + "\n loss scale:" + tail + "\n")
    assert _summary(doc, "metric", "step") == ("grad norm", 5)


RECIPE = """import nemo_run as run
from nemo.collections import llm

def configure():
    return llm.llama3_8b.pretrain_recipe(num_nodes=4, num_gpus_per_node=8)

if __name__ == "__main__":
    run.run(configure(), executor=run.LocalExecutor())
"""


def test_an_unreadable_script_beside_a_read_error_line_is_named_and_the_reading_stands(tmp_path, capsys):
    """A NeMo-Run recipe next to a perfectly read error line exited 2 ("no train command found ...")."""
    recipe = tmp_path / "recipe.py"
    recipe.write_text(RECIPE)
    doc, _ = _doctor(tmp_path, capsys, (REPORTS / "nemo-14348.log").read_text(), str(recipe))
    assert (doc["failure"]["rank"], doc["failure"]["check"]) == (4, "grad-norm-nan")
    assert doc["notes"][0].startswith(f"launch script (a Python file (a NeMo-Run recipe)) not read: {recipe}: no train")
    assert "The input given as the launch script: launch script (a Python file" in doc["verdict"]


def test_a_log_given_as_the_script_is_read_as_a_log(tmp_path, capsys):
    log = tmp_path / "job.log"
    log.write_text(MEGATRON)
    out = tmp_path / "d.json"
    assert main(["doctor", str(log), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["notes"][0] == f"{log}: a job log, not a launch script: read as --traceback"
    assert doc["summary"]["metric"] == "grad norm"


def test_a_wrapper_script_is_said_to_be_one(tmp_path, capsys):
    script = tmp_path / "site.sh"
    script.write_text("#!/bin/bash\nsrun --nodes 2 bash /site/launch_gpt.sh 8 bf16\n")
    assert main(["doctor", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        "(a wrapper: it runs /site/launch_gpt.sh (line 2), which nanscope cannot read here: give that script as the "
        "launch script)\n"
    )


def test_a_wrapper_script_run_by_srun_is_followed(tmp_path, capsys):
    (tmp_path / "real.sh").write_text("torchrun --nproc_per_node $1 pretrain_gpt.py --tensor-model-parallel-size 2\n")
    script = tmp_path / "site.sh"
    script.write_text("srun -N 1 bash real.sh 8\n")
    out = tmp_path / "d.json"
    assert main(["doctor", str(script), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["framework"]["name"], doc["topology"]["gpus_per_node"]) == ("megatron-lm", 8)


def test_openrlhf_s_short_progress_bar_keys_name_the_critic(tmp_path, capsys):
    """OpenRLHF up to v0.6 prints its PPO status in the bar's postfix with short keys (ppo_trainer.py:300-311 at
    v0.6.0): `cri` and `vals` are the critic's, `pg` the actor's. They used to name no model and no framework."""
    bar = ("Episode [1/20]:  10%|#         | 4/40 [01:23<12:30, 20.5s/it, act_lr=5e-7, cri=nan, glen=512, kl=0.01, "
           "pg=0.12, ret=nan, rm=0.5, tlen=900, vals=nan]\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, bar)
    assert doc["framework"]["name"] == "openrlhf"
    assert (doc["summary"]["metric"], doc["summary"]["model"]) == ("cri", "critic")
