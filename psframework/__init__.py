"""psframework: straggler-tolerant MPI parameter-server training for CNNs."""

__version__ = "0.1.0"


def train_module(*args, **kwargs):
    """Train a torch module with a config; see psframework.api.train_module."""
    from psframework.api import train_module as run

    return run(*args, **kwargs)
