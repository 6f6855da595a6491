#!/usr/bin/env bash
# The test suite, on a fresh machine or an existing one: install what is
# missing (scripts/setup.sh: a Vulkan driver when none is present, build
# tools, .venv with pywgtrain[test]), then run pytest on tests/.
# Arguments go to pytest, e.g.
#   bash scripts/test.sh -x -k checkpoint
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
pywgtrain_setup test || exit 1
cd "$PYWGTRAIN_ROOT"
# The installed entry point, not `python -m pytest`: that would put the source
# checkout, which has no compiled extension, first on sys.path. Without
# arguments naming tests, pytest runs testpaths (tests/, pyproject.toml).
exec .venv/bin/pytest -q "$@"
