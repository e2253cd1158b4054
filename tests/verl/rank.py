"""One rank of a verl actor run (tests/verl/harness.py starts two): `python -m tests.verl.rank SPEC.json RANK`.

It builds verl 0.9.0's own `ActorRolloutRefWorker(role="actor")` from verl's ppo_trainer.yaml (Hydra, with the
spec's overrides), calls `init_model()`, then `update_actor()` once per step with this rank's mini-batch
(tests/verl/data.py, planted on rank 1 as the spec says); for role "critic", the critic's `TrainingWorker` built as
verl's trainer builds it (`critic_worker`), and `train_mini_batch()` per step. It writes SPEC.rankR.json: the engine's class, each
step's metrics as the worker returns them and as verl's driver reduces them (`rename_dict(..., "actor/")` +
`reduce_metrics`, trainer/ppo/v1/trainer_base.py:1706-1708), and the exception that ended the run, if any; and
SPEC.rankR.params.pt: the full parameters before the first step and after each (a collective: every rank).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
import traceback

import torch

from tests.verl import faults


def _tiny_fault(model, rank: int, fault: dict | None) -> None:
    """The test-only fault (tests/verl/faults.py): `fault["module"]` outputs NaN on rank `fault["rank"]`."""
    if not fault or rank != fault["rank"]:
        return
    modules = dict(model.named_modules())
    faults.nan_output(modules[next(n for n in modules if n.endswith(fault["module"]))], fault["when"])


# torch.distributed's collectives, and the Tensor methods that read a value to the host
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "all_to_all_single")  # fmt: skip
HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "nonzero")


@contextlib.contextmanager
def counting(into: list):
    """Count the calls of COLLECTIVES and HOST_READS made during one update_actor (test instrumentation: wrappers
    around torch's own functions, removed on exit); appends {name: calls} to `into`."""
    counts: dict[str, int] = {}
    saved = [(torch.distributed, n, getattr(torch.distributed, n)) for n in COLLECTIVES]
    saved += [(torch.Tensor, n, getattr(torch.Tensor, n)) for n in HOST_READS]

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)

        return wrapper

    for owner, name, fn in saved:
        setattr(owner, name, counted(name, fn))
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
        into.append(counts)


def _config(spec: dict):
    import verl
    from hydra import compose, initialize_config_dir

    directory = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=directory, version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(spec["overrides"]))


def _plain(value):
    """A metric as JSON holds it (NaN and inf survive json's own extension)."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "aggregate"):  # verl's Metric
        return _plain(value.aggregate())
    return float(value.item() if hasattr(value, "item") else value)


def _driver(metrics: dict, role: str) -> dict:
    """What verl's driver logs from one update_actor or update of the critic (trainer_base.py:1706-1708,
    :1665-1667), on this rank's copy."""
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict

    out = rename_dict(dict(metrics), f"{role}/")
    if f"{role}/mfu" in out:
        out[f"perf/mfu/{role}"] = out.pop(f"{role}/mfu")
    return {k: _plain(v) for k, v in reduce_metrics(out).items()}


def critic_worker(config):
    """verl's critic: the TrainingWorker (value_model) its trainer builds in init_workers (trainer/ppo/v1/
    trainer_base.py:249-271, the worker class :752), reset and given the value loss (:305-308). The engine is built
    in the worker's constructor (engine_workers.py:135)."""
    from functools import partial

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import value_loss

    critic = omega_conf_to_dataclass(config.critic)
    critic.engine.infer_max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
    critic.engine.max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
    worker = TrainingWorker(
        config=TrainingWorkerConfig(
            model_type="value_model",
            model_config=critic.model,
            engine_config=critic.engine,
            optimizer_config=critic.optim,
            checkpoint_config=critic.checkpoint,
        )  # fmt: skip
    )
    worker.reset()
    worker.set_loss_fn(partial(value_loss, config=critic))
    return worker


def main(path: str, rank: int) -> None:
    with open(path) as f:
        spec = json.load(f)
    # verl first: where VERL_USE_EXTERNAL_MODULES lists the stand-ins, `import verl` applies them (before the plugin);
    # importing them first would start verl from inside them, and the plugin would find them half-applied
    importlib.import_module("verl")
    importlib.import_module("tests.verl.cpu_standin")  # the stand-ins, where verl's import did not apply them
    from tests.verl import data

    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker

    out = {"engine": None, "metrics": [], "driver": [], "error": None, "traceback": None, "counts": [], "seconds": [],
           "cpu": []}  # fmt: skip
    steps = []
    role = spec.get("role", "actor")
    module = None
    try:
        if role == "critic":
            worker = critic_worker(_config(spec))
            engine, update = worker.engine, worker.train_mini_batch
        else:
            worker = ActorRolloutRefWorker(config=_config(spec).actor_rollout_ref, role="actor")
            worker.init_model()
            engine, update = worker.actor.engine, worker.update_actor
        out["engine"] = f"{type(engine).__module__}.{type(engine).__qualname__}"
        module = engine.module
        before = {n: p.full_tensor().detach().clone() for n, p in module.named_parameters()}
        _tiny_fault(module, rank, spec.get("fault"))
        for step in range(spec["steps"]):
            batch = data.mini_batch(rank, step + spec.get("step_offset", 0), spec["plants"].get(str(step)))
            torch.distributed.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            with counting(out["counts"]) if spec.get("count") else contextlib.nullcontext():
                result = update(batch)
            # wall and CPU seconds, for benchmarks/verl_step.py (no test reads a duration)
            out["seconds"].append(time.perf_counter() - start)
            out["cpu"].append(time.process_time() - start_cpu)
            steps.append({n: p.full_tensor().detach().clone() for n, p in module.named_parameters()})
            metrics = dict(tu.get(result, "metrics"))
            out["metrics"].append({k: _plain(v) for k, v in metrics.items()})
            out["driver"].append(_driver(metrics, role))
    except BaseException as e:  # the run's end, as verl's trainer would see it
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()
    with open(f"{path}.rank{rank}.json", "w") as f:
        json.dump(out, f)
    if module is not None and out["error"] is None:
        torch.save({"before": before, "steps": steps}, f"{path}.rank{rank}.params.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
