"""Generated gRPC code for the video-sidecar contract."""
