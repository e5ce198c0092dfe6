"""`video-sidecar` / `python -m sidecar`: the only place that exits the process."""

from __future__ import annotations

import logging
import os
import sys
import threading

from .tools.cli import main as cli_main

# Threads whose work a forced shutdown may have abandoned (see Server.shutdown).
WORKER_THREADS = ("encode", "stream", "segment", "warm")


def main() -> None:
    code = cli_main(sys.argv[1:])
    if any(t.name.startswith(WORKER_THREADS) for t in threading.enumerate() if t.is_alive()):
        # An encoder that would not stop: the interpreter would wait for it at exit (it
        # joins every pool thread). Its segments are unlinked already; leave now.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
