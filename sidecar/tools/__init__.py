"""The command line, and the daemon's own clients (`encode`, `demo`, the launcher):
the only part of `sidecar` that imports `client`."""
