import os
import sys

import pytest

# Tests run on CPU with torch's default threads; keep them from oversubscribing 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _fresh_plugin_installation():
    """The plugin reads its settings once per installation: every test starts with none (and leaves none)."""
    yield
    state = sys.modules.get("nanscope.slime_plugin.state")
    if state is not None:
        state.uninstall()
