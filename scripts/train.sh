#!/usr/bin/env bash
# The main job, on a fresh machine or an existing one: install what is missing
# (scripts/setup.sh: a Vulkan driver when none is present, build tools,
# .venv with pywgtrain[train]), then train an MLP on scikit-learn's digits.
# Arguments go to `pywgtrain train`, e.g.
#   bash scripts/train.sh --epochs 5 --checkpoint run.npz
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
pywgtrain_setup train || exit 1
exec "$PYWGTRAIN_ROOT/.venv/bin/pywgtrain" train "$@"
