"""Generated gRPC code for video_sidecar.v1 (see proto/generate.py)."""
