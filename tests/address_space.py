"""Memory caps (RLIMIT_AS) for the hostile-input tests, sized from what the process's imports map plus the case's
budget: a CPU build of torch maps about 0.6 GiB, a CUDA build several GiB of libraries (a fixed 2 GiB cap made
its import fail: "failed to map segment"). The budget is what a case may allocate on top; a naive reader's
allocation (GiBs to TiBs) does not fit in it.

    CAP + "...imports...\\ncap(BUDGET)\\n..."      # in a process of its own: the cap set once it has imported
    limit = after_imports(IMPORTS) + BUDGET       # for a process capped before it starts (preexec_fn)
"""

from __future__ import annotations

import functools
import subprocess
import sys

# `cap(budget)`: RLIMIT_AS set to this process's address space now plus `budget` (bytes); the cap, returned.
CAP = r"""
import resource

def cap(budget):
    size = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + budget, size + budget))
    return size + budget
"""


@functools.cache
def after_imports(imports: str) -> int:
    """The peak address space (bytes) of a fresh interpreter that ran `imports` (Python source)."""
    code = imports + "\nprint(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmPeak:')))"
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1]) * 1024
