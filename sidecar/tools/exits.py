"""The command line's exit statuses, one rule for every command:

0    done
1    a failure: the daemon or the machine could not do it (unreachable, disk full...)
2    a usage or input problem: fix the command or its input and run it again
128+N  stopped by signal N: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP
"""

from __future__ import annotations

import signal

from client import AlreadyExists, InvalidArgument, OutOfRange, SidecarError

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT  # as shells report Ctrl-C


def exit_status(exc: SidecarError) -> int:
    """2 where the daemon refused what it was asked (a wrong field, over a limit, an
    output that exists), 1 for anything else."""
    refused = isinstance(exc, InvalidArgument | OutOfRange | AlreadyExists)
    return EXIT_USAGE if refused else EXIT_FAILURE


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a one-shot command. A KeyboardInterrupt, so that it unwinds
    as Ctrl-C does: a daemon the command started is stopped, no `.part` file is left."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def terminate(signum: int, _frame: object) -> None:
    """The handler `main` installs for SIGTERM and SIGHUP in commands other than `serve`
    (which has its own): raising is how Python's own SIGINT handler stops a command."""
    raise Terminated(signum)
