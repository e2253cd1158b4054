import pytest

from nanscope import case, hazards
from nanscope.causes import catalogue
from nanscope.trace.tracer import replay


@pytest.fixture(scope="session")
def hazard_trace():
    """(report, hazard site) of each (hazard, loss) replay, computed once per session."""
    cache = {}

    def get(name: str, loss: str = "as-is"):
        if (name, loss) not in cache:
            doc, site = hazards.microbatch_document(name, loss, flags=case.loss_flags())
            cache[name, loss] = (replay.replay(doc), site)
        return cache[name, loss]

    return get


# the hazards the safe loss fixes (a zero temperature and faults in the model it cannot)
HAZARDS = [h.name for h in catalogue.CATALOGUE if h.level == "batch" and h.safe_finite]
