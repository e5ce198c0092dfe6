"""A request planned, admitted, scheduled and run to its output: the encode jobs,
their threads and encoder processes, ready encoders, segments and outputs."""
