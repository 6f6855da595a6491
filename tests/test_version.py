"""The version has one source, ``pywgtrain/__init__.py``: pyproject.toml reads
it (``dynamic = ["version"]``, scikit-build-core's regex provider), so the
installed distribution's metadata and the module agree."""

import importlib.metadata
import re
from pathlib import Path

import pywgtrain

ROOT = Path(__file__).resolve().parent.parent


def test_version_matches_installed_metadata():
    assert pywgtrain.__version__ == importlib.metadata.version("pywgtrain")


def test_pyproject_takes_the_version_from_init():
    pyproject = (ROOT / "pyproject.toml").read_text()
    project = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version\s*=", project, re.M), "pyproject.toml sets a version of its own"
    assert re.search(r'^dynamic = \["version"\]', project, re.M)
    assert 'input = "pywgtrain/__init__.py"' in pyproject
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", pywgtrain.__version__), pywgtrain.__version__
