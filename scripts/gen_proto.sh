#!/usr/bin/env bash
# Regenerate amct_torch/proto/*_pb2.py from proto/*.proto (the generated files are committed).
# Needs the dev extra: pip install -e .[dev]   (grpcio-tools 1.85.1 = protoc 35.1 -> protobuf 7.35+)
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I proto --python_out=amct_torch/proto proto/*.proto
echo "generated: $(ls amct_torch/proto/*_pb2.py | tr '\n' ' ')"
