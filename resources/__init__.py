"""Static resources of RadixChat: app metadata, icons, style sheets, default settings."""

from importlib import resources as _resources


def resource_path(name: str):
    """A path-like to a file shipped in this folder."""
    return _resources.files(__name__).joinpath(name)
