"""Side-by-side benchmarks of video-sidecar against what generation servers do today.

Run `python -m bench --help`. Results are written with the date, the machine and the
command under bench/results/.
"""
