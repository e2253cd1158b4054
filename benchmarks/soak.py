"""Soak: training steps with the plugin installed stay flat in RSS and step time; installs and removals leave nothing.

    python benchmarks/soak.py                          # 200 steps, 40 traced, 100 install/remove cycles: ~4 min
    python benchmarks/soak.py --steps 60 --warmup 5 --cycles 20 --traced-steps 10   # a quick look
    python benchmarks/soak.py --only plugin --steps 400 --trim-every 50 --cycles 0 --traced-steps 0
                                                       # one variant alone: its own RSS, and the live heap
    python benchmarks/soak.py --json soak.json         # also every figure and per-step series as JSON

One process, as tests/workers/hook_worker.py: a gloo group of one rank, megatron-core on CPU
(nanscope.megatron.cpu), the tiny Qwen3-MoE of nanscope.megatron.model (fp32, DDP with the bucket NaN check,
megatron's Adam, megatron's OptimizerParamScheduler), 1 torch thread. Every step trains one healthy
case-shaped rollout of 8 samples (one micro-batch each; the same tokens every step), whose log-probs come
from the current model (slime's log-prob pass, untimed), like slime v0.1.0's train_one_step: zero grads ->
before_train_step -> megatron's 1F1B forward_backward_func -> optimizer.step -> scheduler.step.

Soak (--steps): two models from the same seed, trained alternately, the order swapped at every step, so that
the machine's load falls on both alike (--only: one of them alone):
  plugin  the plugin as documented: the hook (before_train_step at every step, NANSCOPE_ON_NONFINITE=raise,
          the default) and the plugin's loss (--loss-type custom_loss, nanscope.slime_plugin.policy_loss)
  plain   slime without nanscope: its own loss, from a private copy of nanscope.loss.as_is (the plugin's
          observing wrappers on that module would otherwise see these calls too)
After --warmup steps, the first and the last 20 % of the steps: per variant the median step time (process
CPU and wall) and its drift (last / first - 1), and the Theil-Sen trend through every step (robust to a
burst of load); the same for the per-step plugin / plain ratio (most of the load cancels out of it) and
for the process's RSS after each step. The calls one step makes (sys.setprofile, a load-free measure of
its work), once after the warm-up and once at the end. --trim-every N: every N steps also the RSS after a
collection and glibc's malloc_trim (freed heap handed back), whose slope is what the heap keeps per step.
Every healthy step must pass: no report, no skip.

Traced (--traced-steps): more steps of the plugin model, hook installed, under tracemalloc: the bytes traced
after each step (after a collection), their slope over the second half, and the snapshot's differences by
line over it (what a step keeps, and where).

Cycles (--cycles): on a model that never had the hook (after one plain step, so that megatron's lazily made
attributes exist), install it (before_train_step), train one step with the plugin's loss (--cycle-steps; 0:
install and remove only), uninstall(). Against the model before the first install: hooks on every module
and parameter and torch's global module hooks, every instance attribute of the modules, optimizer (and its
inner torch optimizer), scheduler and loss module (callables by identity), the plugin's registry. Between
the middle and the end (the first half settles one-off growth: first-call caches, and ~185 KB allocated
where the output checks add their attributes to the modules' dicts, flat after ~40 cycles): live nanscope objects and functions, live tensors, threads, open fds,
files under the benchmark's own TMPDIR and NANSCOPE_REPORT_DIR, and the bytes tracemalloc traces (started
before the first cycle). The first cycle also reports what an installed hook adds, so that each check is
seen to detect it.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
import types
import warnings
from pathlib import Path

MODULE_HOOKS = (
    "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)  # fmt: skip
GLOBAL_HOOKS = (
    "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks",
    "_global_forward_hooks_always_called",
)  # fmt: skip
SAMPLES = 8


class Trainer:
    """One model, its optimizer and scheduler, trained like slime's train_one_step on a fixed healthy rollout."""

    def __init__(self, seed: int, loss_module, args, lr_steps: int):
        from nanscope import case
        from nanscope.megatron import bootstrap
        from nanscope.megatron.model import TinyQwen3MoE

        self.model, _, self.optimizer = bootstrap.build_training(seed=seed, bf16=False)
        self.scheduler = lr_schedule(self.optimizer, lr_steps)
        self.loss_module, self.args = loss_module, args
        self.rollout, self.seed = case.rollout(TinyQwen3MoE().vocab_size, seed), seed
        self.batch = None

    def run(self, tokens):  # [S] -> logits [1, S padded to a multiple of 64, V]
        import torch

        padded = -(-tokens.numel() // 64) * 64
        x = torch.nn.functional.pad(tokens, (0, padded - tokens.numel())).unsqueeze(0)
        return self.model(input_ids=x, position_ids=None, attention_mask=None, labels=None)

    def build_batch(self) -> dict:
        """The rollout with the current model's log-probs (healthy: the policy is the model itself)."""
        import torch

        from nanscope import hazards

        def policy(tokens):
            with torch.no_grad():
                return [self.run(t)[0, : t.numel()].float() for t in tokens]

        self.batch = hazards.build("healthy", policy, self.rollout, self.seed)
        self.batch.pop("hazard_site")
        return self.batch

    def step(self, rollout_id: int, hook: bool) -> float:
        """One train_one_step on `self.batch`; returns the grad norm."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from nanscope import slime_plugin

        batch, n = self.batch, len(self.batch["response_lengths"])
        micro = [{k: [v[i]] for k, v in batch.items()} for i in range(n)]
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        if hook:
            slime_plugin.before_train_step(self.args, rollout_id, 0, [self.model], self.optimizer, self.scheduler)

        def forward_step(it, model):
            mb = next(it)

            def loss(logits):
                return self.loss_module.loss_function(self.args, mb, n, logits[:, : mb["total_lengths"][0]].float())

            return self.run(mb["unconcat_tokens"][0]), loss

        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro), model=[self.model], num_microbatches=n,
            seq_length=256, micro_batch_size=1, forward_only=False,
        )  # fmt: skip
        ok, grad_norm, _ = self.optimizer.step()
        assert ok, "a healthy step was not taken"
        self.scheduler.step(increment=n)
        return float(grad_norm)


def lr_schedule(optimizer, lr_steps: int):
    """1e-6 decaying linearly to 0 over `lr_steps` samples (the hook wraps the scheduler's step too)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    for group in optimizer.param_groups:
        group.update(max_lr=1e-6, min_lr=0.0)
    return OptimizerParamScheduler(
        optimizer, init_lr=1e-6, max_lr=1e-6, min_lr=0.0, lr_warmup_steps=0, lr_decay_steps=lr_steps,
        lr_decay_style="linear", start_wd=0.1, end_wd=0.1, wd_incr_steps=lr_steps, wd_incr_style="constant",
    )  # fmt: skip


def private_copy(module: types.ModuleType) -> types.ModuleType:
    """A second, unregistered instance of `module` (its own globals): slime's loss without the plugin's wrappers."""
    spec = importlib.util.spec_from_file_location(f"soak_private_{module.__name__.replace('.', '_')}", module.__file__)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]  # fmt: skip


def malloc_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back (mallinfo2: uordblks + hblkhd), whatever the
    fragmentation; Python's own small-object arenas are not in it."""
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def calls(fn) -> int:
    """The Python and C function calls fn() makes (sys.setprofile): a step's work, whatever the machine's load."""
    n = 0

    def count(frame, event, arg):
        nonlocal n
        n += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def timed(fn) -> tuple[float, float]:
    """(wall s, process CPU s) of fn()."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def windows(series: list[float], warmup: int) -> tuple[float, float, float, float]:
    """(median of the first 20 % after the warm-up, of the last 20 %, drift = last / first - 1, trend).

    trend: the Theil-Sen line through every step after the warm-up (the median of the pairwise slopes: robust
    to a burst of load), from its first step to its last, over the median.
    """
    kept = series[warmup:]
    k = max(1, len(kept) // 5)
    first, last = statistics.median(kept[:k]), statistics.median(kept[-k:])
    pairs = [(kept[j] - kept[i]) / (j - i) for i in range(len(kept)) for j in range(i + 1, len(kept))]
    trend = statistics.median(pairs) * (len(kept) - 1) / statistics.median(kept)
    return first, last, last / first - 1, trend


def slope(series: list[float]) -> float:
    """Least-squares slope of `series` per index (bytes per cycle or step)."""
    n = len(series)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, statistics.fmean(series)
    num = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(series))
    return num / sum((x - mean_x) ** 2 for x in range(n))


def soak(a, args_plugin, args_plain) -> tuple[dict, dict]:
    """--steps alternating plugin and plain steps: the per-step series and their windows, and the trainers (the
    plugin's hook still installed)."""
    from nanscope import slime_plugin
    from nanscope.loss import as_is

    lr_steps = SAMPLES * (a.steps + a.traced_steps + 2)
    trainers = {
        "plugin": Trainer(a.seed, as_is, args_plugin, lr_steps),
        "plain": Trainer(a.seed, private_copy(as_is), args_plain, lr_steps),
    }
    trainers = {name: trainer for name, trainer in trainers.items() if a.only in (None, name)}
    series = {f"{name}_{clock}": [] for name in trainers for clock in ("wall", "cpu")} | {"rss": []}
    work = {name: [] for name in trainers}  # Python and C calls of a step after the warm-up and at the end
    trimmed = []  # (steps done, RSS after a collection and glibc's malloc_trim, malloc's bytes in use)
    t0 = time.monotonic()
    for i in range(a.steps):
        order = list(trainers) if i % 2 == 0 else list(reversed(trainers))
        for name in order:
            trainer = trainers[name]
            trainer.build_batch()
            wall, cpu = timed(lambda: trainer.step(i, hook=name == "plugin"))
            series[f"{name}_wall"].append(wall)
            series[f"{name}_cpu"].append(cpu)
        series["rss"].append(rss_bytes())
        if a.trim_every and (i + 1) % a.trim_every == 0:  # the live heap: freed memory handed back to the system
            gc.collect()
            ctypes.CDLL(None).malloc_trim(0)
            trimmed.append((i + 1, rss_bytes(), malloc_in_use()))
        if i in (a.warmup, a.steps - 1):  # one more step each, untimed: the calls it makes
            for name, trainer in trainers.items():
                trainer.build_batch()
                work[name].append(calls(lambda: trainer.step(i, hook=name == "plugin")))
        if (i + 1) % 25 == 0:
            print(f"  soak: step {i + 1}/{a.steps}, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    assert slime_plugin.reports() == [] and slime_plugin.skipped_steps() == 0, "a healthy step was reported"
    result = {
        "steps": a.steps,
        "warmup": a.warmup,
        "seconds": time.monotonic() - t0,
        "series": series,
        "calls": work,
        "rss_trimmed": trimmed,
    }
    for key, values in series.items():
        result[key] = windows(values, a.warmup)
    for clock in ("wall", "cpu") if len(trainers) == 2 else ():
        ratios = [p / q for p, q in zip(series[f"plugin_{clock}"], series[f"plain_{clock}"])]
        result[f"ratio_{clock}"] = windows(ratios, a.warmup)
    return result, trainers


def footprint(trainer, loss_module) -> dict:
    """What an installed hook could leave behind on `trainer`'s model, optimizer and scheduler, and globally."""
    import torch

    from nanscope.slime_plugin import state

    modules = list(trainer.model.modules())
    hooks = sum(len(getattr(m, name, None) or {}) for m in modules for name in MODULE_HOOKS)
    for p in trainer.model.parameters():
        hooks += len(p._backward_hooks or {}) + len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    hooks += sum(len(getattr(torch.nn.modules.module, name, {})) for name in GLOBAL_HOOKS)
    owners = modules + [trainer.optimizer, getattr(trainer.optimizer, "optimizer", None), trainer.scheduler]
    owners.append(loss_module)
    attributes = {
        (f"{type(owner).__name__}#{i}", key): id(value) if callable(value) else None
        for i, owner in enumerate(o for o in owners if o is not None)
        for key, value in vars(owner).items()
    }
    return {"hooks": hooks, "attributes": attributes, "registry": state.current() is not None}


def residue(tmp: Path) -> dict:
    """Process-wide counts that a leak would grow (after a full collection)."""
    import torch

    gc.collect()
    objects = gc.get_objects()
    with warnings.catch_warnings():  # isinstance() on torch.distributed's deprecated aliases warns
        warnings.simplefilter("ignore")
        ours = collections.Counter(name for name in map(_nanscope_name, objects) if name is not None)
        tensors = sum(1 for o in objects if isinstance(o, torch.Tensor))
    del objects
    return {
        "nanscope_objects": dict(ours),
        "tensors": tensors,
        "threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
        "files": sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()),
    }


def _nanscope_name(o) -> str | None:
    """An object of a nanscope class, or a function defined in nanscope (closures too): its name; else None."""
    if isinstance(o, types.FunctionType):
        module, name = getattr(o, "__module__", None), f"function {o.__qualname__}"
    else:
        module, name = getattr(type(o), "__module__", None), type(o).__qualname__
    return name if isinstance(module, str) and module.startswith("nanscope") else None


def cycles(a, args_plugin, args_plain, tmp: Path) -> dict:
    """--cycles installs and removals of the hook (and the plugin's loss) on a model that never had it."""
    from nanscope import slime_plugin
    from nanscope.loss import as_is

    trainer = Trainer(a.seed + 1, private_copy(as_is), args_plain, SAMPLES * (a.cycles * a.cycle_steps + 2))
    trainer.build_batch()
    trainer.step(0, hook=False)  # a plain step first: the optimizer's and megatron's lazily made attributes
    trainer.loss_module, trainer.args = as_is, args_plugin  # then the plugin as documented: its loss too
    gc.collect()
    pristine = footprint(trainer, as_is)
    tracemalloc.start()
    half = a.cycles // 2
    out, t0 = {"cycles": a.cycles, "measured_cycles": a.cycles - half, "cycle_steps": a.cycle_steps}, time.monotonic()
    traced = []  # bytes tracemalloc traces after each cycle (after a collection)
    for c in range(a.cycles):
        if c == half:  # the residue before the snapshot, so that what it holds is in both snapshots
            before = residue(tmp)
            first = tracemalloc.take_snapshot()
        slime_plugin.before_train_step(trainer.args, c, 0, [trainer.model], trainer.optimizer, trainer.scheduler)
        if c == 0:
            installed = footprint(trainer, as_is)
            out["installed_adds"] = {
                "hooks": installed["hooks"] - pristine["hooks"],
                "attributes": len(set(installed["attributes"].items()) - set(pristine["attributes"].items())),
                "registry": installed["registry"],
            }
        for s in range(a.cycle_steps):
            trainer.step(c, hook=s > 0)  # installed above for the first step already
        slime_plugin.uninstall()
        gc.collect()
        traced.append(tracemalloc.get_traced_memory()[0])
        if (c + 1) % 25 == 0:
            print(f"  cycles: {c + 1}/{a.cycles}, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    last = tracemalloc.take_snapshot()
    tracemalloc.stop()
    after, final = residue(tmp), footprint(trainer, as_is)
    diff = _own_lines_out(last).compare_to(_own_lines_out(first), "lineno")
    out.update(
        seconds=time.monotonic() - t0,
        hooks=(pristine["hooks"], final["hooks"]),
        attributes_changed=sorted(
            {k for k, _ in set(final["attributes"].items()) ^ set(pristine["attributes"].items())}
        ),
        registry_after=final["registry"],
        residue_before=before,
        residue_after=after,
        traced=traced,
        traced_first_half_bytes=traced[half - 1] - traced[0] if half > 1 else 0,
        traced_growth_bytes=traced[-1] - traced[half],  # from the first cycle after the snapshot's
        traced_bytes_per_cycle=slope(traced[half:]),
        traced_top=[str(stat) for stat in diff[:6] if stat.size_diff],
    )
    return out


def _own_lines_out(snapshot):
    """The snapshot without this file's allocations (the series it keeps)."""
    return snapshot.filter_traces([tracemalloc.Filter(False, __file__)])


def traced_steps(a, trainer) -> dict:
    """--traced-steps more steps of the plugin model, hook installed, under tracemalloc: what a step retains."""
    from nanscope import slime_plugin

    tracemalloc.start()
    half, t0, traced = a.traced_steps // 2, time.monotonic(), []
    for i in range(a.traced_steps):
        if i == half:
            first = tracemalloc.take_snapshot()
        trainer.build_batch()
        trainer.step(a.steps + i, hook=True)
        gc.collect()
        traced.append(tracemalloc.get_traced_memory()[0])
    last = tracemalloc.take_snapshot()
    tracemalloc.stop()
    slime_plugin.uninstall()
    diff = _own_lines_out(last).compare_to(_own_lines_out(first), "lineno")
    return {
        "steps": a.traced_steps,
        "measured_steps": a.traced_steps - half,
        "seconds": time.monotonic() - t0,
        "traced": traced,
        "growth_bytes": traced[-1] - traced[half],  # from the first step after the snapshot's
        "bytes_per_step": slope(traced[half:]),
        "top": [str(stat) for stat in diff[:6] if stat.size_diff],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="soak steps per variant (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="soak steps left out of the windows (default 20)")
    p.add_argument("--traced-steps", type=int, default=40, help="plugin steps under tracemalloc after the soak")
    p.add_argument("--cycles", type=int, default=100, help="installs and removals of the hook (default 100)")
    p.add_argument("--cycle-steps", type=int, default=1, help="training steps per cycle (default 1; 0: none)")
    p.add_argument(
        "--trim-every",
        type=int,
        default=0,
        metavar="N",
        help="every N steps also the RSS after gc and glibc's malloc_trim (the live heap; default off)",
    )
    p.add_argument("--only", choices=("plugin", "plain"), help="soak one variant alone (its RSS alone)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write every figure and series here")
    a = p.parse_args()
    if (
        a.steps - a.warmup < 5
        or a.cycles == 1
        or min(a.cycles, a.cycle_steps, a.traced_steps) < 0
        or a.traced_steps == 1
    ):
        p.error("need --steps >= --warmup + 5, --cycles 0 or >= 2, --cycle-steps >= 0, --traced-steps 0 or >= 2")
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    tempfile.tempdir = os.environ["TMPDIR"] = str(tmp)  # every temp file of this process and the plugin's: counted
    os.environ.update(NANSCOPE_REPORT_DIR=str(tmp / "reports"), NANSCOPE_ON_NONFINITE="raise")

    import torch

    from nanscope import case
    from nanscope.facts import paths
    from nanscope.megatron import bootstrap

    torch.set_num_threads(1)
    bootstrap.init()
    args_plain, args_plugin = case.args(global_batch_size=SAMPLES), case.args(global_batch_size=SAMPLES)
    for args in (args_plain, args_plugin):  # one optimizer step per rollout, as slime's train/step counts them
        args.rollout_batch_size = SAMPLES // args.n_samples_per_prompt
    args_plugin.loss_type, args_plugin.custom_loss_function_path = "custom_loss", paths.LOSS_FUNCTION_PATH
    try:
        result, trainers = soak(a, args_plugin, args_plain)
        result["traced"] = traced_steps(a, trainers["plugin"]) if a.traced_steps and "plugin" in trainers else None
        result["cycles"] = cycles(a, args_plugin, args_plain, tmp) if a.cycles else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_report(result)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


def print_report(r: dict) -> None:
    def row(label, key, scale=1.0):
        first, last, drift, trend = r[key]
        print(
            f"  {label:<30} {first * scale:>10.4g} {last * scale:>10.4g} {drift * 100:>+9.2f} % {trend * 100:>+9.2f} %"
        )

    n = len(r["series"]["rss"]) - r["warmup"]
    print(f"soak: {r['steps']} steps per variant after {r['warmup']} warm-up steps, windows of "
          f"{max(1, n // 5)} steps, {r['seconds']:.0f} s")  # fmt: skip
    print(f"  {'median':<30} {'first 20%':>10} {'last 20%':>10} {'drift':>11} {'trend':>11}")
    for clock in ("cpu", "wall"):
        for key, label in ((f"plugin_{clock}", "plugin step"), (f"plain_{clock}", "plain step"),
                           (f"ratio_{clock}", "plugin / plain per step")):  # fmt: skip
            if key in r:
                row(f"{label}, {clock}" + ("" if key.startswith("ratio") else " (s)"), key)
    row("RSS (MiB)", "rss", 1 / 2**20)
    for name, (early, late) in r["calls"].items():
        print(f"  {name} step's calls (sys.setprofile): after the warm-up {early:,}, at the end {late:,} "
              f"({(late - early) / early * 100:+.3f} %)")  # fmt: skip
    trimmed = [row for row in r["rss_trimmed"] if row[0] > r["warmup"]]
    if len(trimmed) >= 2:
        (n0, b0, m0), (n1, b1, m1) = trimmed[0], trimmed[-1]
        print(f"  RSS after malloc_trim: {b0 / 2**20:.2f} MiB after step {n0}, {b1 / 2**20:.2f} MiB after step {n1} "
              f"({(b1 - b0) / (n1 - n0) / 1024:+.2f} KiB per step); malloc's bytes in use {m0 / 2**20:.2f} -> "
              f"{m1 / 2**20:.2f} MiB ({(m1 - m0) / (n1 - n0) / 1024:+.2f} KiB per step)")  # fmt: skip
    keys = ("rss", "ratio_cpu", "ratio_wall", "plugin_cpu", "plugin_wall", "plain_cpu", "plain_wall")
    within = [k for k in keys if k in r and abs(r[k][2]) <= 0.02]
    print(f"  |drift| <= 2 %: {', '.join(within) or 'none'}")
    t = r["traced"]
    if t:
        print(f"traced: {t['steps']} more plugin steps under tracemalloc ({t['seconds']:.0f} s): over the last "
              f"{t['measured_steps']}, {t['growth_bytes']:+} B traced, slope {t['bytes_per_step']:+.0f} B per step; "
              "the snapshot's differences by line:")  # fmt: skip
        for line in t["top"]:
            print(f"    {line}")
    c = r["cycles"]
    if not c:
        return
    b, e = c["residue_before"], c["residue_after"]
    print(f"cycles: {c['cycles']} installs and removals, {c['cycle_steps']} step(s) each, {c['seconds']:.0f} s; "
          f"an installed hook adds {c['installed_adds']}")  # fmt: skip
    print(f"  against the model before the first install: hooks {c['hooks'][0]} -> {c['hooks'][1]}, attributes "
          f"changed {c['attributes_changed'] or 'none'}, registry {'held' if c['registry_after'] else 'empty'}")  # fmt: skip
    ours_b, ours_e = b["nanscope_objects"], e["nanscope_objects"]
    changed = {
        k: (ours_b.get(k, 0), ours_e.get(k, 0)) for k in set(ours_b) | set(ours_e) if ours_b.get(k) != ours_e.get(k)
    }
    print(f"  after cycle {c['cycles'] - c['measured_cycles']} -> after cycle {c['cycles']}: nanscope objects "
          f"{sum(ours_b.values())} -> {sum(ours_e.values())} {changed or ''}, tensors {b['tensors']} -> {e['tensors']}, "
          f"threads {b['threads']} -> {e['threads']}, fds {b['fds']} -> {e['fds']}, files {b['files']} -> {e['files']}")  # fmt: skip
    print(f"  tracemalloc: {c['traced_first_half_bytes']:+} B over the first {c['cycles'] - c['measured_cycles']} "
          f"cycles (one-off), {c['traced_growth_bytes']:+} B over the last {c['measured_cycles']}, slope "
          f"{c['traced_bytes_per_cycle']:+.0f} B per cycle; the snapshot's differences by line:")  # fmt: skip
    for line in c["traced_top"]:
        print(f"    {line}")


if __name__ == "__main__":
    main()
