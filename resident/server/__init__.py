"""The server: an HTTP API process and an engine-core process, connected over ZMQ IPC."""
