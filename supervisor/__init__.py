"""elastic-supervisor: fault-tolerance supervisor for elastic Horovod training on Kubernetes."""

__version__ = "0.1.0"
