"""Issue 43, case F: both install paths give nanscope's engine subclass (the config line is every other case's;
here VERL_USE_EXTERNAL_MODULES, listed after the CPU stand-ins so the platform is `cpu` first), and a bad
NANSCOPE_* value ends init_model on every rank with one line naming the variable. verl reaches the plugin from
HFModelConfig.__post_init__ (workers/config/model.py:148-149), built by omega_conf_to_dataclass (engine_workers.py:534):
Hydra wraps the error in lines of its own (InstantiationException, full_key), around the plugin's one line."""

import pytest

from tests.verl import harness, plugin

pytestmark = pytest.mark.timeout(600)


def test_f_verl_use_external_modules_installs_nanscopes_engine(tmp_path, model):
    ranks = harness.run(plugin.spec(install="env", env=plugin.with_reports(tmp_path)), tmp_path, model)
    for rank in ranks:
        assert rank.error is None and plugin.ours(rank), rank.engine
        assert any(k.startswith("actor/nanscope/") for k in rank.driver[0])


def test_f_a_bad_setting_fails_init_model_in_one_line(tmp_path, model):
    ranks = harness.run(plugin.spec(env={"NANSCOPE_MAX_SKIPS": "zero"}), tmp_path, model)
    for rank in ranks:
        assert rank.engine is None and rank.error is not None  # init_model ended: no engine, no step
        ours = [line for line in rank.error.splitlines() if "NANSCOPE_MAX_SKIPS" in line]
        assert len(ours) == 1 and "NANSCOPE_MAX_SKIPS='zero': expected an integer >= 1" in ours[0], rank.error
