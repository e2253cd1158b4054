"""bootstrap.import_megatron: megatron-core imported with torch.compile deferred to a first call
(cpu_megatron.compile_on_first_call)."""

import subprocess
import sys

from nanscope.megatron import cpu_megatron


def test_compile_on_first_call_compiles_once_with_the_options_at_the_first_call():
    compiled = []

    def fake_compile(fn, **options):
        compiled.append((fn.__name__, options))
        return lambda *a, **k: ("compiled", fn(*a, **k))

    def double(x):
        return 2 * x

    f = cpu_megatron._compile_on_first_call(fake_compile, double, dynamic=False)
    assert compiled == [] and f.__name__ == "double"  # decorating compiles nothing
    assert f(3) == ("compiled", 6) and f(4) == ("compiled", 8)
    assert compiled == [("double", {"dynamic": False})]
    # as a decorator with options only: torch.compile(mode=...)(fn)
    g = cpu_megatron._compile_on_first_call(fake_compile, mode="max-autotune")(double)
    assert g(1) == ("compiled", 2) and compiled[-1] == ("double", {"mode": "max-autotune"})


def test_import_megatron_skips_inductor_and_restores_torch_compile():
    code = (
        "import sys, torch; real = torch.compile\n"
        "from nanscope.megatron import bootstrap; bootstrap.import_megatron()\n"
        "import megatron.core.jit as jit\n"
        "print(torch.compile is real, 'torch._inductor.compile_fx' in sys.modules, jit.jit_fuser.func.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False", "_compile_on_first_call"], out.stderr[-2000:]
