#!/usr/bin/env bash
# The main job, on a fresh machine or an existing one: install what is missing
# (scripts/setup.sh: a Vulkan driver when none is present, build tools,
# .venv with pywgtrain[train]), then train a small GPT on the Python standard
# library's own sources (`pywgtrain gpt`). Arguments go to `pywgtrain gpt`, e.g.
#   bash scripts/train.sh --config small --steps 2000 --checkpoint run.safetensors
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
pywgtrain_setup train || exit 1
exec "$PYWGTRAIN_ROOT/.venv/bin/pywgtrain" gpt "$@"
