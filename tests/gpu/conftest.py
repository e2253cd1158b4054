"""The GPU tier (`pytest -m gpu`): every test here is marked `gpu` and skipped where torch sees no CUDA device.

Each scenario runs in its own subprocess on one device (`scenario.run`) and writes one JSON document: what it
measured, and the machine it measured it on (`scenario.machine`: torch, CUDA, the GPU, whether TransformerEngine
and apex are importable, and the shims applied). Plain `pytest` deselects the tier (`addopts` in pyproject).
"""

from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
