#!/usr/bin/env bash
# Regenerate the committed Python modules from api.proto (run from anywhere).
# Generated with grpcio-tools 1.85.1 (protobuf 7.36.2); tests/test_podresources.py checks that
# the committed modules match what this command produces.
# Running protoc from the repository root with the package path in the file name makes the
# generated api_pb2_grpc.py import "from gpuagent.pods.kubelet import api_pb2", so no edit is needed.
set -euo pipefail
cd "$(dirname "$0")/../../.."
"${PYTHON:-.venv/bin/python}" -m grpc_tools.protoc -I. \
    --python_out=. --pyi_out=. --grpc_python_out=. \
    gpuagent/pods/kubelet/api.proto
