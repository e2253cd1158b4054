"""Importing this module applies tests/verl/standins.py's three stand-ins, once per process (Python imports a module
once): a rank imports it before verl's worker, and VERL_USE_EXTERNAL_MODULES may list it before nanscope.verl_plugin
(verl imports that list inside `import verl`, verl/__init__.py:38-41), so the platform is `cpu` before the plugin
asks verl for the device."""

from tests.verl import standins

standins.platform()
standins.engine_and_padding()
