"""PyAV and nothing else of the daemon's: frames and their geometry, frames still
landing, the encoder, its options and their rules, audio, and the allocator's memory."""
