"""attnviz's version, in a module of its own: the base modules (spec) read it without importing
the package's top, which is the public face (the API) and may import every layer."""

__version__ = "0.1.0"


def package_version() -> str:
    """The installed package's version, else (running from a source tree) __version__."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnviz")
    except PackageNotFoundError:
        return __version__
