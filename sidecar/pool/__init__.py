"""The shared-memory slabs, the regions leased from them, who holds which, and the
queue for room."""
