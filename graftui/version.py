"""The library version, in a leaf of its own so that every module can name it."""

__version__ = "0.3.0"
