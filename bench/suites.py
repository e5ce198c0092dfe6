"""The benchmark suites. Each returns rows; `__main__` prints and records them.

Each suite lives in a module of its own (`e2e`, `transfer`, `throughput`, `streaming`,
`memory`; `node` and `traffic` beside them); the daemon they start is `daemons.daemon`.
"""

from __future__ import annotations

from .daemons import daemon, pool_for
from .e2e import default_samples, e2e
from .memory import TreeMemory, children, memory, status_kib, tree_rss_anon
from .streaming import streaming
from .throughput import throughput
from .transfer import transfer

__all__ = [
    "TreeMemory",
    "children",
    "daemon",
    "default_samples",
    "e2e",
    "memory",
    "pool_for",
    "status_kib",
    "streaming",
    "throughput",
    "transfer",
    "tree_rss_anon",
]
