"""The daemon's faces: gRPC and the framed socket. Protos in, domain calls, status
codes out; each domain error is mapped to its status here, once."""
