"""Boss's server-side bounded contexts, each a gRPC service, plus the shared plumbing in `shared`."""
