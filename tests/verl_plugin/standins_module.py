"""worker.py's CPU stand-ins as an importable module, for VERL_USE_EXTERNAL_MODULES: listed before
nanscope.verl_plugin, so that the CPU platform and FSDP for "cpu" exist when the plugin installs inside
`import verl` (verl/__init__.py:38-41)."""

from tests.verl_plugin import worker

worker.standins()
worker.standin_engines()
