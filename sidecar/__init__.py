"""video-sidecar: the daemon that turns raw frames in pooled shared memory into video files.

The package is CPU-only and never imports torch. See README.md for the architecture.
"""

__version__ = "0.1.0"
