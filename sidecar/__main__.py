"""`video-sidecar` / `python -m sidecar`: the only place that exits the process."""

from __future__ import annotations

import sys

from .cli import main as cli_main


def main() -> None:
    sys.exit(cli_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
