"""megatron-core 0.15.0rc0's two gaps on a GPU without TransformerEngine, shimmed only where TE is absent.

    from nanscope.megatron import te_less
    te_less.apply()      # before megatron builds the optimizer or the router runs; the names applied
    te_less.applied()    # what apply() applied in this process (read without importing megatron-core)

Found on an H200 image with torch and megatron-core but neither TransformerEngine nor apex (line numbers of
core_v0.15.0rc0, equal to the megatron-core==0.15.0rc0 wheel's):

1. `OptimizerConfig.__post_init__` calls `is_te_min_version("2.1.0")` for the precision-aware optimizer
   (optimizer/optimizer_config.py:227, imported at :8). Without TE, `get_te_version()` is None (utils.py:288-313) and
   `None >= PkgVersion(...)` raises TypeError (utils.py:324): `--use-precision-aware-optimizer` with
   `--optimizer-cpu-offload` (the case's HybridDeviceOptimizer, which returns at :233 and needs no TE) cannot be
   configured. Shim: optimizer_config's `is_te_min_version` answers False (no TE is at least any version), so
   `store_param_remainders` is turned off (:227-228), as for a TE older than 2.1.0: the remainders are TE FusedAdam's.
2. `RouterGatingLinearFunction` tests `te_general_gemm is not None` (transformer/moe/moe_utils.py:931, :951), a name
   bound only when TE imports (moe_utils.py:12-28): every MoE router's forward raises `NameError: te_general_gemm`.
   Shim: `moe_utils.te_general_gemm = None`, so the router's GEMM is torch.mm, the path it takes for fp64 (:935).

Each applied shim prints one line to stderr naming it. Where TransformerEngine is importable, `apply` does nothing
and imports nothing. Only the GPU tier (tests/gpu) and the benchmarks' CUDA runs apply them; the slime plugin never
does (a user's run has its own megatron-core), and the CPU harness has its own stand-in for the router's GEMM
(`cpu.install`). What was applied is kept on the `megatron.core` module, not here.
"""

from __future__ import annotations

import importlib.util
import sys

_RECORD = "_nanscope_te_less_shims"  # on megatron.core: the names applied, in order


def te_present() -> bool:
    """TransformerEngine is importable here (found, not imported)."""
    return importlib.util.find_spec("transformer_engine") is not None


def _no_te_min_version(version, check_equality=True) -> bool:
    """megatron-core's is_te_min_version where TransformerEngine is absent: no installed TE is at least `version`."""
    return False


def apply() -> list[str]:
    """Apply each shim that this process needs (TE absent, the gap still open); idempotent.

    Returns:
        The names of the shims applied in this process (`applied()`): [] where TransformerEngine is importable.
    """
    if te_present():
        return []
    import megatron.core  # heavy: megatron-core, shimmed here
    from megatron.core.optimizer import optimizer_config  # heavy: megatron-core
    from megatron.core.transformer.moe import moe_utils

    done = list(getattr(megatron.core, _RECORD, ()))
    shims = [
        # optimizer_config.py:227 is_te_min_version("2.1.0") -> False (TypeError on None without TE, utils.py:324)
        (optimizer_config, "is_te_min_version", _no_te_min_version,
         "optimizer_config.is_te_min_version answers False (the precision-aware optimizer's TE version check)"),
        # moe_utils.py:931, :951 te_general_gemm, unbound without TE -> None (the router's GEMM: torch.mm)
        (moe_utils, "te_general_gemm", None,
         "moe_utils.te_general_gemm = None (the MoE router's GEMM is torch.mm)"),
    ]  # fmt: skip
    for owner, name, value, says in shims:
        label = f"{owner.__name__}.{name}"
        if label in done or (name == "te_general_gemm" and hasattr(owner, name)):
            continue  # applied already, or bound (the CPU layer's stand-in)
        setattr(owner, name, value)
        done.append(label)
        print(f"nanscope: warning: TransformerEngine is absent: shimmed megatron-core's {says}", file=sys.stderr)
    setattr(megatron.core, _RECORD, tuple(done))
    return list(done)


def applied() -> list[str]:
    """The shims `apply` applied in this process, e.g. 'megatron.core.transformer.moe.moe_utils.te_general_gemm'."""
    core = sys.modules.get("megatron.core")
    return list(getattr(core, _RECORD, ())) if core is not None else []
