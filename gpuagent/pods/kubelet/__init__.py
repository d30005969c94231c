"""Generated gRPC/protobuf code for the kubelet pod-resources v1 API (see regenerate.sh)."""
