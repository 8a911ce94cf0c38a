#!/usr/bin/env bash
# Install amct_torch into a virtual environment (./.venv by default) the same way for users,
# CI and the Docker image.
#   bash scripts/setup.sh           # the package
#   bash scripts/setup.sh --test    # the package and everything the tests need
# Environment: AMCT_VENV=path (where the venv goes), AMCT_EXTRAS=a,b (optional extras, e.g.
# leveldb,hdf5), AMCT_NO_VENV=1 (install into the current Python, e.g. a CUDA PyTorch image
# that already has torch).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
# AMCT_EXTRAS=leveldb,hdf5 adds optional extras (Caffe's LevelDB and HDF5 data), e.g. in Docker
[ -n "${AMCT_EXTRAS:-}" ] && extras="[${AMCT_EXTRAS}${extras:+,test}]"
py=${PYTHON:-python3}
if [ -z "${AMCT_NO_VENV:-}" ]; then
  venv=${AMCT_VENV:-.venv}
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  py="$venv/bin/python"
fi
"$py" -m pip install -q --upgrade pip
# Keep an existing torch (a CUDA image's); else take the CPU wheel, never a multi-GB CUDA build.
if ! "$py" -c "import torch" 2>/dev/null; then
  "$py" -m pip install -q "torch==2.13.0"
fi
"$py" -m pip install -q -e ".$extras"
echo "amct_torch installed for $("$py" -c 'import sys; print(sys.executable)')"
