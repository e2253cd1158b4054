"""The CLI tests' shared fixture."""

import pytest


@pytest.fixture
def wide_terminal(monkeypatch):
    """A terminal 160 columns wide: doctor's verdict box wraps no sentence a test quotes (a module asks for it with
    `pytestmark = pytest.mark.usefixtures("wide_terminal")`)."""
    monkeypatch.setenv("COLUMNS", "160")
