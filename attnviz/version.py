"""attnviz's version, in a module of its own: the base modules (spec) read it without importing
the package's top, which is the public face (the API) and may import every layer."""

__version__ = "0.1.0"
