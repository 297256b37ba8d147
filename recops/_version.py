"""recops' version: the one place it is written (setup.py reads it; ``recops.__version__``)."""

__version__ = "0.2.0"
