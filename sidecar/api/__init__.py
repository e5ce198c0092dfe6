"""Generated gRPC code for the video-sidecar contract, and nothing else (see
proto/generate.py)."""
