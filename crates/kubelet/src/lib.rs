//! Kubelet-facing plumbing: plugin registration, DRA and health gRPC over unix sockets.
