"""What the Boss services and the device worker both use, and nothing only a server needs: UTC time
and protobuf Timestamps, service addresses and the data folder, the bearer metadata of a call,
reconnecting a followed stream, the details of a rich gRPC error status, and the logging set-up.

It depends on grpcio, protobuf and googleapis-common-protos only, so the worker package
(packaging/worker/) ships it without any server code; `services.shared` builds on it."""
