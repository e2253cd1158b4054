"""`nanscope trace BUNDLE` and `nanscope trace REPORT_DIR`: a repro bundle replayed offline through nanscope's
model of slime v0.1.0 (no slime here), against the in-process trace of the same loss call.

The bundles are written as the plugin writes them: the loss watch observes `nanscope.loss.as_is` (the release the
CPU harness runs) and `slime_plugin.bundles.document` builds the file from what it kept.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from nanscope import case, hazards
from nanscope.cli import trace as trace_cli
from nanscope.cli.main import main
from nanscope.facts.args import loss_args
from nanscope.loss import as_is, formulas, microbatch
from nanscope.loss import target as targets
from nanscope.slime_plugin import bundles
from nanscope.slime_plugin.coords import Coords
from nanscope.slime_plugin.loss_watch import LossWatch
from nanscope.trace.bundles import bundle
from nanscope.trace.tracer import replay
from tests.dumps.hostile import isolated

pytestmark = pytest.mark.usefixtures("wide_lines")  # trace's lines asserted whole

SENTINEL = {"module": "output_layer", "microbatch": 0, "order": 0, "param": "output_layer.weight"}


def _line(fn) -> int:
    lines, start = inspect.getsourcelines(fn)
    (hit,) = [start + i for i, line in enumerate(lines) if ".exp()" in line]
    return hit


def write(
    path: Path, hazard: str = "kl-exp-overflow", *, cp: int = 1, ranks=None, report=None, rollout: int = 1, **coords
) -> tuple:
    """A bundle of the hazard's micro-batch as the plugin writes it on the last stage (CP `cp`: a call per CP rank in
    `ranks`, all in one bundle unless the coords name the rank); returns the hazard site."""
    doc, site = hazards.microbatch_document(hazard, flags=case.loss_flags())
    args = loss_args(**doc["args"])
    watch = LossWatch(targets.model(), microbatch=lambda: 0)
    try:
        watch.begin()
        for r in ranks if ranks is not None else range(cp):
            par = microbatch.Parallel(cp_rank=r, cp_size=cp)
            logits = doc["logits"].clone().requires_grad_(True)
            local = microbatch.cp_local_logits(logits, doc["batch"]["total_lengths"], par) if cp > 1 else logits
            as_is.loss_function(args, microbatch.slice_for_cp(doc["batch"], par), 1, local, parallel=par)
    finally:
        watch.remove()
    report = {"rank": 2, "first_forward": None, "first_backward": SENTINEL, "class": "loss-numerics"} | (report or {})
    doc = bundles.document(
        target=targets.model(), coords=Coords(rank=2, pp=1, **coords), args=args,
        where={"rollout_id": rollout, "step_id": 0}, report=report, seen=watch.seen,
        why={i: ["sentinel-backward"] for i in range(len(watch.seen))},
    )  # fmt: skip
    torch.save(doc, path)
    return site


@pytest.mark.parametrize("cp", [1, 2])
def test_a_bundle_names_the_op_sample_and_token_the_in_process_trace_names(tmp_path, capsys, cp):
    path = tmp_path / "rollout1_step0_rank2.bundle.pt"
    sample, token = write(path, cp=cp)
    in_process = replay.replay(hazards.microbatch_document("kl-exp-overflow", flags=case.loss_flags())[0])
    assert main(["trace", str(path), "--json", str(tmp_path / "t.json")]) == 1
    text = capsys.readouterr().out
    first = json.loads((tmp_path / "t.json").read_text())["bundle"]["first"]
    for phase in ("forward", "backward"):
        got, want = first[phase], getattr(in_process, phase)
        assert (got["op"], got["source"], got["node"], got["sample"], got["token"], got["masked"]) == (
            want.op, want.source, want.node, want.sample, want.token, want.masked,
        )  # fmt: skip
        assert (got["sample"], got["token"]) == (sample, token)
    source = f"nanscope/loss/formulas.py:{_line(formulas.approx_kl)}"
    head = f"nanscope trace: {path}: rollout 1 step 0, rank 2 (pp 1, tp 0, cp 0 of 1, dp 0 of 1), written by nanscope "
    assert text.startswith(head)
    assert (
        "loss: nanscope's model of slime v0.1.0 (nanscope.loss.as_is; slime is not installed) (the bundle was written "
        "through it (nanscope's CPU harness))\n"
    ) in text
    assert "  autograd node: ExpBackward0 (created in forward by exp)\n" in text
    assert "class: loss-numerics (an op of the loss made a finite input non-finite)\n" in text
    assert (
        f"verdict: the NaN starts in the loss: aten.exp.default at {source} in approx_kl, sample {sample}, response "
        f"token {token}, loss_mask 0 (masked)\n"
    ) in text
    assert "; d loss / d log-probs finite in every micro-batch\n" in text  # the guard's replay
    if cp == 2:  # the two CP ranks' calls of one micro-batch, the hazard's token on one of them
        assert ", cp 0 of 2 (the bundle's)): " in text
        assert ", cp 1 of 2 (the bundle's)): " in text
        # A bundle without the calls' own coordinates (a simulated CP): each call's is its place among the calls
        doc = torch.load(path, weights_only=True)
        for entry in doc["microbatches"]:
            entry.pop("parallel", None)
        torch.save(doc, path)
        assert main(["trace", str(path)]) == 1
        text = capsys.readouterr().out
        assert ", cp 0 of 2 (inferred: loss call 1 of 2 on forward micro-batch)): " in text
        assert ", cp 1 of 2 (inferred: loss call 2 of 2 on forward micro-batch)): " in text


def test_cp_ranks_each_write_their_bundle_and_get_their_own_line(tmp_path, capsys):
    for r in (0, 1):
        write(tmp_path / f"rollout1_step0_rank{r}.bundle.pt", cp=2, ranks=[r], cp_rank=r, cp_size=2)
    assert main(["trace", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"nanscope trace: {tmp_path}: 2 bundles, 0 other files"
    assert lines[2].startswith("rollout 1 step 0, rank 2 (pp 1, tp 0, cp 0 of 2, dp 0 of 1): ")
    assert lines[3].startswith("rollout 1 step 0, rank 2 (pp 1, tp 0, cp 1 of 2, dp 0 of 1): ")
    assert sum(" in approx_kl, sample " in line for line in lines[2:4]) == 1  # one CP rank holds the token


def test_without_current_log_probs_the_replay_is_approximate(tmp_path, capsys):
    path = tmp_path / "x.bundle.pt"
    write(path)
    doc = torch.load(path, weights_only=True)
    doc["microbatches"][0]["current"] = None
    torch.save(doc, path)
    assert main(["trace", str(path), "--json", str(tmp_path / "t.json")]) == 1
    text = capsys.readouterr().out
    assert "replayed from the old-policy log_probs (approximate)" in text
    assert "approximate: the bundle kept no current log-probs for some micro-batch; the old-policy log_probs " in text
    assert json.loads((tmp_path / "t.json").read_text())["bundle"]["approximate"] is True


def test_a_finite_replay_exits_0_and_points_upstream_to_the_sentinel(tmp_path, capsys):
    path = tmp_path / "x.bundle.pt"
    hit = {"module": "decoder.layers.0.self_attention", "microbatch": 1}
    write(path, "healthy", report={"first_backward": hit, "class": "model-backward"})
    assert main(["trace", str(path)]) == 0
    text = capsys.readouterr().out
    assert (
        "verdict: the loss replays finite from the recorded inputs: the NaN started upstream of the loss, in the "
        "model; the sentinel's first non-finite module, backward: module 'decoder.layers.0.self_attention', "
        "micro-batch 1; to name its op, rerun the step on the cluster as the report's replay says "
        "(NANSCOPE_TRACE_STEP)\n"
    ) in text
    assert "class: not in the loss; the report's class: model-backward\n" in text


def test_a_non_finite_input_is_data(tmp_path, capsys):
    path = tmp_path / "x.bundle.pt"
    write(path, "nan-rollout-logprob")
    assert main(["trace", str(path)]) == 1
    text = capsys.readouterr().out
    assert "class: data (a non-finite input reached the loss: rollout_log_probs)\n" in text
    assert "verdict: a non-finite input reached the loss: rollout_log_probs at sample " in text
    assert "forward producer: none; no op turned finite values into non-finite ones" in text


def test_a_report_directory_one_line_per_rank_and_step_earliest_first(tmp_path, capsys):
    write(tmp_path / "rollout3_step0_rank2.bundle.pt", rollout=3)
    write(tmp_path / "rollout1_step0_rank2.bundle.pt", "healthy")
    stage0 = torch.load(tmp_path / "rollout1_step0_rank2.bundle.pt", weights_only=True)
    stage0["coords"] |= {"rank": 0, "pp": 0, "last_stage": False}
    for mb in stage0["microbatches"]:
        mb |= {"batch": None, "current": None, "loss": None}
    torch.save(stage0, tmp_path / "rollout1_step0_rank0.bundle.pt")
    report = {"rank": 1, "rollout_id": 1, "step_id": 0, "first_forward": None, "first_backward": SENTINEL}
    (tmp_path / "rollout1_step0_rank1.json").write_text(json.dumps({**report, "class": None}))
    torch.save({"format": replay.SENTINEL_FORMAT, "rollout_id": 1, "step_id": 0}, tmp_path / "rollout1_step0_rank1.pt")
    (tmp_path / "notes.txt").write_text("not ours")
    assert main(["trace", str(tmp_path), "--json", str(tmp_path / "t.json")]) == 1
    lines = capsys.readouterr().out.splitlines()
    old = tmp_path / "rollout1_step0_rank1.pt"
    model = "nanscope's model of slime v0.1.0 (nanscope.loss.as_is; slime is not installed)"
    # the loss they replayed through, as a bundle's trace says it; the rows; the guard; the earliest cause's verdict
    event = f"aten.exp.default at nanscope/loss/formulas.py:{_line(formulas.approx_kl)} in approx_kl, sample "
    verdict = f"verdict (rollout 3 step 0, rank 2): the NaN starts in the loss: {event}"
    assert lines == [
        f"nanscope trace: {tmp_path}: 3 bundles, 2 other files",
        f"loss: {model} (the bundle was written through it (nanscope's CPU harness)), for every bundle",
        f"not replayed: {old}: the sentinel's copy of a micro-batch's input_ids, no logits to replay: rerun the step "
        'as the report\'s "replay" says (NANSCOPE_TRACE_STEP=1:0)',
        "rollout 1 step 0, rank 0 (pp 0, tp 0, cp 0 of 1, dp 0 of 1): no loss on this rank; the sentinel's first "
        "non-finite module, backward: module 'output_layer', micro-batch 0",
        "rollout 1 step 0, rank 1: report only, no bundle: the sentinel's first non-finite module, backward: module "
        "'output_layer', micro-batch 0; class undecided",
        lines[5],
        lines[6],
        f"with the guard (nanscope.loss.guard around {model}, as the plugin's loss runs it): loss and d loss / d "
        "log-probs finite in every replayed micro-batch of the 2 bundle(s) that hold a loss (rollout 1 step 0, rank "
        "2; rollout 3 step 0, rank 2)",
        lines[8],
    ]
    assert lines[5].startswith("rollout 1 step 0, rank 2 (pp 1, tp 0, cp 0 of 1, dp 0 of 1): the loss replays finite")
    assert lines[6].startswith("rollout 3 step 0, rank 2 (pp 1, tp 0, cp 0 of 1, dp 0 of 1): aten.exp.default at ")
    # the verdict: rollout 3's bundle, the earliest that names the cause (rollout 1's replays finite), as its row
    assert lines[6].endswith(", loss_mask 0 (masked) (loss-numerics)") and lines[8].startswith(verdict)
    assert lines[8] == verdict + lines[6].split(f": {event}")[1].removesuffix(" (loss-numerics)")
    assert json.loads((tmp_path / "t.json").read_text())["verdict"] == lines[8]
    # a --slime-src that is not there: one line, exit 2; one that is, unused by these bundles: said so
    assert main(["trace", str(tmp_path), "--slime-src", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == (
        f"nanscope trace: error: --slime-src {tmp_path / 'nope'}: no such directory (give a slime checkout)\n"
    )
    assert main(["trace", str(tmp_path), "--slime-src", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines()[1] == (
        f"loss: {model} (the bundle was written through it (nanscope's CPU harness); --slime-src {tmp_path} not "
        "used), for every bundle"
    )


def test_the_cli_knows_the_bundle_suffix_without_importing_torch():
    assert trace_cli.BUNDLE_SUFFIX == bundle.SUFFIX  # the one fact, facts.paths


def _hostile(tmp_path: Path, healthy: Path) -> dict:
    """name -> (path, the error after "PATH: ")."""
    doc = torch.load(healthy, weights_only=True)
    mb = doc["microbatches"][0]

    def variant(name: str, change) -> Path:
        changed = torch.load(healthy, weights_only=True)
        change(changed, changed["microbatches"][0])
        torch.save(changed, tmp_path / name)
        return tmp_path / name

    class Executes:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"format": bundle.FORMAT, "x": Executes()}, tmp_path / "code.bundle.pt")
    data = healthy.read_bytes()
    (tmp_path / "cut.bundle.pt").write_bytes(data[: len(data) // 2])
    n = len(mb["batch"]["total_lengths"])
    local = mb["batch"]["log_probs"][1].numel()
    assert n >= 2 and mb["index"] == 0 and mb["batch"]["loss_masks"][1].dtype == torch.float32
    return {
        "cut": (tmp_path / "cut.bundle.pt", "repro bundle: not a readable zip archive: File is not a zip file"),
        # issue 32 item 12: torch's reason, not its advice to load with weights_only=False (which runs the code)
        "code": (
            tmp_path / "code.bundle.pt",
            "not a nanscope repro bundle (torch.load weights_only: Unsupported global: GLOBAL print was not an "
            "allowed global by default)\n",
        ),
        "format": (
            variant("f.bundle.pt", lambda d, m: d.update(format="x")),
            "format 'x': expected 'nanscope-bundle/1' (a repro bundle)",
        ),
        "shape": (
            variant("s.bundle.pt", lambda d, m: m["batch"]["log_probs"].__setitem__(1, torch.zeros(2, 3))),
            "micro-batch 0: log_probs of sample 1: expected a 1-D float tensor, got torch.float32 [2, 3]",
        ),
        "lengths": (
            variant("l.bundle.pt", lambda d, m: m["batch"]["response_lengths"].__setitem__(1, 5)),
            f"micro-batch 0: loss_masks of sample 1: {doc['microbatches'][0]['batch']['loss_masks'][1].numel()} "
            "entries, expected a 1-D tensor of 5 entries",
        ),
        "samples": (
            variant("n.bundle.pt", lambda d, m: m["batch"]["advantages"].pop()),
            f"micro-batch 0: batch: advantages has {n - 1} samples, total_lengths has {n}",
        ),
        "current": (
            variant("c.bundle.pt", lambda d, m: m["current"]["log_probs"].__setitem__(1, torch.zeros(local + 1))),
            f"micro-batch 0: current log_probs of sample 1: {local + 1} entries != {local} local response tokens",
        ),
        "stride0": (
            variant("z.bundle.pt", lambda d, m: m["current"]["log_probs"].__setitem__(1, torch.zeros(1).expand(10**9))),
            "micro-batch 0: current log_probs of sample 1: tensor of 1,000,000,000 elements with stride 0 over a storage of 1, "
            "expected each element stored once",
        ),
        "rows": (
            variant("r.bundle.pt", lambda d, m: m.update(rows=[0])),
            f"micro-batch 0: rows: expected {n} integers >= 0 (one dump row per sample)",
        ),
        "coords": (
            variant("k.bundle.pt", lambda d, m: d["coords"].update(cp_rank=2)),
            "coords: cp_rank 2 outside cp_size 1",
        ),
        # issue 32 item 12: a tensor's micro-batch by its loss call's index (7), not its place in the list (0)
        "index": (
            variant(
                "i.bundle.pt",
                lambda d, m: (
                    m.update(index=7),
                    m["current"]["log_probs"].__setitem__(1, torch.zeros(1).expand(10**9)),
                ),
            ),
            "micro-batch 7: current log_probs of sample 1: tensor of 1,000,000,000 elements with stride 0 over a "
            "storage of 1, expected each element stored once",
        ),
        # issue 32 items 1 and 9: values the field checks let through, the replay then crashed on or used
        "loss list": (
            variant("ll.bundle.pt", lambda d, m: m.update(loss=[1])),
            "micro-batch 0: loss: expected a dict or None, got list",
        ),
        "current list": (
            variant("cl.bundle.pt", lambda d, m: m.update(current=[1])),
            "micro-batch 0: current: expected a dict or None, got list",
        ),
        "rows dict": (
            variant("rd.bundle.pt", lambda d, m: m.update(rows=dict.fromkeys(range(n), 0))),
            "micro-batch 0: rows: expected a list or None, got dict",
        ),
        "rows 10**30": (
            variant("rh.bundle.pt", lambda d, m: m.update(rows=[10**30] * n)),
            f"micro-batch 0: rows: expected {n} integers >= 0 (one dump row per sample)",
        ),
        "bool tokens": (
            variant(
                "tb.bundle.pt",
                lambda d, m: m["batch"]["unconcat_tokens"].__setitem__(1, m["batch"]["unconcat_tokens"][1] > 0),
            ),
            "micro-batch 0: unconcat_tokens of sample 1: expected integer token ids, got torch.bool",
        ),
        "negative token": (
            variant("tn.bundle.pt", lambda d, m: m["batch"]["unconcat_tokens"][1].__setitem__(3, -5)),
            "micro-batch 0: unconcat_tokens of sample 1: token id -5 at position 3: expected ids >= 0",
        ),
        "mask nan": (
            variant("mn.bundle.pt", lambda d, m: m["batch"]["loss_masks"][1].__setitem__(2, float("nan"))),
            "micro-batch 0: loss_masks of sample 1: entry 2 is nan: expected 0 or 1",
        ),
        "mask 7": (
            variant("m7.bundle.pt", lambda d, m: m["batch"]["loss_masks"][1].__setitem__(0, 7)),
            "micro-batch 0: loss_masks of sample 1: entry 0 is 7.0: expected 0 or 1",
        ),
        "groups 0": (
            variant("g0.bundle.pt", lambda d, m: d["args"].update(n_samples_per_prompt=0)),
            "args: n_samples_per_prompt 0: expected an integer >= 1",
        ),
        "estimator": (
            variant("ae.bundle.pt", lambda d, m: d["args"].update(advantage_estimator="magic")),
            "args: advantage_estimator 'magic': expected one of cispo, grpo, gspo, ppo, reinforce_plus_plus, "
            "reinforce_plus_plus_baseline",
        ),
        "10**400": (
            variant("bi.bundle.pt", lambda d, m: d["args"].update(seed=10**400)),
            "args: seed <1329-bit integer>: outside int64",
        ),
        # issue 42: a rank of 2**63 and a rollout id of 10**23 were accepted
        "rank 2**63": (
            variant("r63.bundle.pt", lambda d, m: d["coords"].update(rank=2**63)),
            "coords rank: expected an integer from 0 to 2,147,483,647, got int 9223372036854775808",
        ),
        "rollout 10**23": (
            variant("r23.bundle.pt", lambda d, m: d.update(rollout_id=10**23)),
            "rollout_id: expected an integer from 0 to 9,223,372,036,854,775,807, got int 100000000000000000000000",
        ),
        "no microbatches": (
            variant("e.bundle.pt", lambda d, m: d.update(microbatches=[])),
            "microbatches: empty (a bundle holds the loss calls of the step it was written on)",
        ),
        "version": (
            variant("v.bundle.pt", lambda d, m: d.update(nanscope="9" * 1000)),
            "nanscope: expected the version that wrote it, a string of 1-40 characters",
        ),
        "version int": (
            variant("vi.bundle.pt", lambda d, m: d.update(nanscope=5)),
            "nanscope: expected the version that wrote it, a string of 1-40 characters",
        ),
        # issue 32 item 5: str.format of '{rollout_id:>3000000000}' allocates 3 GB
        "template": (
            variant(
                "tp.bundle.pt", lambda d, m: d["args"].update(save_debug_rollout_data="/d/{rollout_id:>3000000000}.pt")
            ),
            "args: save_debug_rollout_data '/d/{rollout_id:>3000000000}.pt': {rollout_id:>3000000000}: expected an "
            "integer format of width <= 64, e.g. {rollout_id:04d}",
        ),
        "template field": (
            variant("tf.bundle.pt", lambda d, m: d["args"].update(load_debug_rollout_data="/d/{args.__class__}.pt")),
            "args: load_debug_rollout_data '/d/{args.__class__}.pt': {args.__class__}: a path template fills only "
            "{rollout_id}, {rank}",
        ),
    } | {  # NaN or inf clip and coefficient: a loss every entry of which is NaN
        f"{name} {value}": (
            variant(f"{name}{value}.bundle.pt", lambda d, m, name=name, value=value: d["args"].update({name: value})),
            f"args: {name} {value!r}: expected a finite number",
        )
        for name in ("eps_clip", "kl_loss_coef")
        for value in (math.nan, math.inf, -math.inf)
    }


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_hostile_bundles_are_one_line_exit_2(tmp_path):
    healthy = tmp_path / "healthy.bundle.pt"
    write(healthy, "healthy")
    cases = _hostile(tmp_path, healthy)
    results = isolated([["trace", str(path)] for path, _ in cases.values()])
    for (name, (path, error)), res in zip(cases.items(), results, strict=True):
        assert res["rc"] == 2, (name, res)
        assert res["stderr"].startswith(f"nanscope trace: error: {path}: {error}"), (name, res["stderr"])
        assert res["stderr"].count("\n") == 1 and "pwned" not in res["stderr"], name
        assert "weights_only=False" not in res["stderr"] and "\\x1b" not in res["stderr"], name
        assert res["grew"] < 64 * 2**20, (name, res)


@pytest.mark.slow  # two fresh interpreters: the fast tier checks the core install's imports (tests/test_core_install.py)
def test_the_core_install_replays_through_the_model_and_refuses_slime_src_in_one_line(tmp_path):
    """On a training image without megatron-core (blocked here) a bundle replays through nanscope's model;
    --slime-src needs megatron-core and says so."""
    import subprocess
    import sys

    from tests.test_core_install import BLOCK

    path = tmp_path / "x.bundle.pt"
    write(path)
    run = "from nanscope.cli.main import main; import sys; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK + run, "trace", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1 and "verdict: the NaN starts in the loss: aten.exp.default at " in proc.stdout
    (tmp_path / "slime" / "slime" / "backends" / "megatron_utils").mkdir(parents=True)
    (tmp_path / "slime" / "slime" / "backends" / "megatron_utils" / "loss.py").write_text("")
    doc = torch.load(path, weights_only=True)
    doc["release"] |= {"name": "v0.1.0", "module": "slime.backends.megatron_utils.loss", "log_prob_returns": "dict"}
    torch.save(doc, path)
    argv = ["trace", str(path), "--slime-src", str(tmp_path / "slime")]
    proc = subprocess.run([sys.executable, "-c", BLOCK + run, *argv], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (
        2,
        "nanscope trace: error: slime's loss imports megatron-core, which is not installed here: pip install "
        "'nanscope[repro]', or replay without --slime-src (nanscope's model of slime v0.1.0)\n",
    )


def test_a_release_bundle_without_slime_replays_through_the_model_and_says_so(tmp_path, capsys):
    path = tmp_path / "x.bundle.pt"
    write(path)
    doc = torch.load(path, weights_only=True)
    doc["release"] |= {"name": "v0.1.0", "module": "slime.backends.megatron_utils.loss", "log_prob_returns": "dict"}
    torch.save(doc, path)
    assert main(["trace", str(path)]) == 1
    assert (
        "loss: nanscope's model of slime v0.1.0 (nanscope.loss.as_is; slime is not installed) (the bundle was written "
        "through slime v0.1.0, which is not importable here: give --slime-src DIR)\n"
    ) in capsys.readouterr().out


def test_the_replay_runs_on_the_device_it_is_given(tmp_path):
    # meta holds shapes, no data: the loss and the guard's call on the bundle's tensors mix no device and read nothing
    # (the tracer and the outcome read values, so a whole replay runs where data is: the CPU here, CUDA on a GPU)
    from nanscope.trace.bundles import bundle_load, bundle_replay

    write(tmp_path / "b.bundle.pt")
    doc = bundle_load.load(tmp_path / "b.bundle.pt")
    entry = doc["microbatches"][0]
    with bundle_replay.loss_path(doc) as path:
        args = bundle_replay._args(doc["args"], path)
        batch = bundle_replay.on_device(entry["batch"], "meta")
        par = microbatch.Parallel(cp_rank=entry["cp"][0], cp_size=entry["cp"][1])
        current, _ = bundle_replay._current(entry, entry["batch"])
        for guarded in (False, True):
            leaves = bundle_replay._leaves(current, "meta")
            with bundle_replay._guarded(path, par) if guarded else contextlib.nullcontext():
                value = bundle_replay._run(path, args, batch, par, leaves)
            assert value.is_meta and all(x.grad.is_meta for x in leaves["log_probs"])
        on_cpu = bundle_replay.replay(doc, path, source="b", device="cpu").to_dict()
    assert on_cpu == bundle_replay_default(tmp_path / "b.bundle.pt")


def bundle_replay_default(path):
    from nanscope.trace.bundles import bundle_load, bundle_replay

    doc = bundle_load.load(path)
    with bundle_replay.loss_path(doc) as loss:
        return bundle_replay.replay(doc, loss, source="b").to_dict()
