#!/usr/bin/env bash
# The main job: install what is missing, build, and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh build
./build/apps/qat gradcheck
./build/apps/qat train --compare
