"""psframework: straggler-tolerant MPI parameter-server training for CNNs."""

__version__ = "0.1.0"
