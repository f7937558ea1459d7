"""The web console: static HTML, CSS and ES modules (no build step) served by the API at `/console/`."""

from ops.console._mount import STATIC_DIR, mount_console

__all__ = ["STATIC_DIR", "mount_console"]
