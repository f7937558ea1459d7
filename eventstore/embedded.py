"""Embedded PostgreSQL, used when no LEDGERFLOW_DATABASE_URL is configured.

The server comes from the ``pgserver`` package, which bundles PostgreSQL 16
binaries in its wheel, so nothing has to be installed system-wide.

Lifecycle
---------
* Data lives in ``default_data_dir()`` (or the directory passed in) and is
  never deleted: it survives process exits and restarts.
* The server is shared by every process that calls :func:`start_embedded` on
  the same data directory. A later caller finds the running server through
  ``postmaster.pid`` and connects to it instead of starting a second one;
  concurrent first starts are serialised by pgserver's inter-process lock.
* The server is stopped cleanly (``pg_ctl stop``) when the last process that
  called :func:`start_embedded` exits normally; this also ends any other
  session still connected to it, such as a ``psql`` opened on the URL. A
  process killed with SIGKILL leaves it running, which is harmless: the next
  call reuses it.
* It listens only on a unix socket inside the data directory, never on TCP.
  Authentication is ``trust``, so the socket's directory permissions (0700,
  owned by the server's user) are what keep other local users out.

Running as root
---------------
PostgreSQL refuses to run as root. When the effective uid is 0, pgserver
creates a system user ``pgserver`` (via ``useradd``), chowns the data
directory to it and runs ``initdb``/``pg_ctl`` as that user. So that user can
reach the data directory, pgserver adds ``o+rx`` to every ancestor directory
and to its own bundled binaries. ledgerflow does not let it loosen a private
directory: as root the default data directory is ``/var/lib/ledgerflow/pgdata``
(whose parents are already world-traversable), and a data directory under a
parent that others cannot traverse (``/root``, a 0700 home) is refused with
advice, before pgserver changes anything.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import urllib.parse
import warnings

import platformdirs
import structlog

_log = structlog.get_logger(__name__)

_NEXT_STEP = (
    "Set LEDGERFLOW_DATABASE_URL to a PostgreSQL server "
    "(e.g. postgresql://user:password@localhost:5432/ledgerflow)"
)


def _shell_safe(path: pathlib.Path) -> bool:
    # pgserver hands the socket directory (the data directory) to postgres
    # through pg_ctl's shell command line without quoting it, so on POSIX a
    # path with spaces or shell metacharacters cannot start a server.
    return os.name != "posix" or shlex.quote(str(path)) == str(path)


_ROOT_DATA_DIR = pathlib.Path("/var/lib/ledgerflow/pgdata")


def _as_root() -> bool:
    return os.name == "posix" and os.geteuid() == 0


def _private_ancestor(path: pathlib.Path) -> pathlib.Path | None:
    """The first existing ancestor of `path` that other users cannot traverse, if any."""
    for parent in reversed(path.parents):
        if parent.exists() and not parent.stat().st_mode & 0o001:
            return parent
    return None


def _refuse_private_ancestors(data_dir: pathlib.Path) -> None:
    """As root, pgserver would make every ancestor of the data directory and of its own binaries
    world-traversable; refuse, with advice, where that would loosen a private directory."""
    from pgserver._commands import POSTGRES_BIN_PATH

    from eventstore.errors import ConfigurationError

    for what, path, fix in [
        (
            "data directory",
            data_dir,
            f"set LEDGERFLOW_EMBEDDED_DATA_DIR to a directory under {_ROOT_DATA_DIR.parent} (the default "
            "as root)",
        ),
        (
            "bundled PostgreSQL",
            pathlib.Path(POSTGRES_BIN_PATH),
            "install ledgerflow (its virtual environment) outside that directory",
        ),
    ]:
        private = _private_ancestor(path)
        if private is not None:
            raise ConfigurationError(
                f"The embedded PostgreSQL runs as another user when ledgerflow runs as root, and that user "
                f"cannot reach its {what} ({path}) through {private} (mode "
                f"{private.stat().st_mode & 0o777:o}); ledgerflow will not loosen that directory. Either "
                f"{fix}, or run as an ordinary user. {_NEXT_STEP}."
            )


def default_data_dir() -> pathlib.Path:
    """Per-user directory holding the embedded server's data.

    The platform's user data directory, unless that path cannot be used (on
    macOS it is under "Application Support"); then ~/.local/share is used.
    """
    if _as_root():
        return _ROOT_DATA_DIR
    path = pathlib.Path(platformdirs.user_data_dir("ledgerflow")) / "pgdata"
    if not _shell_safe(path):
        path = pathlib.Path.home() / ".local" / "share" / "ledgerflow" / "pgdata"
    return path


def start_embedded(data_dir: pathlib.Path | None = None) -> str:
    """Start (or reuse) the embedded PostgreSQL server and return its URL.

    The URL is a libpq URI for the ``postgres`` superuser and database,
    reached over the unix socket, e.g.
    ``postgresql://postgres@/postgres?host=/home/me/.local/share/ledgerflow/pgdata&port=5432``.

    Raises ``eventstore.errors.ConfigurationError`` if pgserver is not
    installed or the server cannot be started or reached.
    """
    from eventstore.errors import ConfigurationError

    # pgserver resolves the path itself; resolving here too keeps the logged
    # path identical to the one it uses and to the one in postgres's cmdline.
    if data_dir is None:
        data_dir = default_data_dir()
    data_dir = data_dir.expanduser().resolve()
    log_file = data_dir / "log"

    if not _shell_safe(data_dir):
        raise ConfigurationError(
            f"The embedded PostgreSQL cannot use {data_dir}: its path contains spaces or "
            f"shell characters. Choose a data directory without them. {_NEXT_STEP}."
        )

    try:
        # pgserver looks up a runtime directory at import time, and
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI);
        # its /tmp fallback is fine, and the warning would fail test runs
        # that turn warnings into errors.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            # The submodule, because the package's __init__ re-exports
            # get_server implicitly, which strict type checking rejects.
            from pgserver.postgres_server import get_server
    except ImportError as exc:
        raise ConfigurationError(
            "No database configured and the embedded PostgreSQL is unavailable "
            f"(pgserver is not installed: {exc}). {_NEXT_STEP}, or install pgserver."
        ) from exc

    if _as_root():
        _refuse_private_ancestors(data_dir)
    try:
        if _as_root():
            _ensure_server_user()
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        _discard_stale_lock_files(data_dir)
        # cleanup_mode="stop": the last process using the server stops it;
        # "delete" would wipe the data, None would leave a server running
        # indefinitely after every use (including tests on temporary dirs).
        server = get_server(data_dir, cleanup_mode="stop")
        info = server.get_postmaster_info()
    # pgserver surfaces failures as CalledProcessError (initdb, pg_ctl,
    # useradd), TimeoutExpired, OSError, RuntimeError and bare asserts; the
    # advice to the user is the same for all of them.
    except Exception as exc:
        raise ConfigurationError(
            f"Could not start the embedded PostgreSQL in {data_dir}: {exc!r}. "
            f"Its log, if any, is {log_file}. {_NEXT_STEP}."
        ) from exc

    if info.socket_dir is None or info.port is None:
        raise ConfigurationError(
            f"The embedded PostgreSQL in {data_dir} is not listening on a unix "
            f"socket (see {data_dir / 'postmaster.pid'}). {_NEXT_STEP}."
        )
    # Percent-encoded because libpq decodes query values, and a path may hold
    # '%', '+' or ':' (all shell-safe).
    host = urllib.parse.quote(str(info.socket_dir), safe="/")
    url = f"postgresql://postgres@/postgres?host={host}&port={info.port}"

    _check_reachable(url, data_dir, log_file)
    _log.debug("embedded_postgres_started", data_dir=str(data_dir), url=url)  # shown by `ledgerflow db url`
    return url


#: The system user pgserver runs PostgreSQL as when ledgerflow runs as root.
_SERVER_USER = "pgserver"
#: Serialises the creation of that user between processes (root-only, like the user itself).
_SERVER_USER_LOCK = _ROOT_DATA_DIR.parent / "server-user.lock"


def _ensure_server_user(name: str = _SERVER_USER) -> None:
    """Create pgserver's system user before pgserver does. pgserver runs `useradd` outside its
    inter-process lock, so two processes starting their first embedded servers at once race and the loser
    fails (useradd exits 9, "already exists"). Here creation happens under a lock, and a user created by
    anyone in the meantime counts as created."""
    import fcntl
    import pwd
    import shutil
    import subprocess

    def exists() -> bool:
        try:
            pwd.getpwnam(name)
        except KeyError:
            return False
        return True

    if exists():
        return
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    _SERVER_USER_LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(_SERVER_USER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if exists():
            return
        # A fixed command with a fixed or test-made user name: nothing untrusted reaches it.
        done = subprocess.run([useradd, "-s", "/bin/bash", name], capture_output=True, text=True)  # noqa: S603
        # 9: "already exists", created meanwhile by a process that does not take this lock.
        if done.returncode not in (0, 9) or not exists():
            raise RuntimeError(f"useradd {name} exited {done.returncode}: {done.stderr.strip()}")
    finally:
        os.close(fd)


def _discard_stale_lock_files(data_dir: pathlib.Path) -> None:
    """Remove lock files left by a server that is no longer running.

    ``postmaster.pid`` and the socket's ``.s.PGSQL.<port>.lock`` start with
    the server's pid. pgserver takes any live pid in ``postmaster.pid`` for a
    running server, and postgres refuses to start while either file names a
    live pid. After a crash or a reboot that pid can be a zombie (in
    containers whose init does not reap) or an unrelated process: the server
    would then never start, and pgserver's exit cleanup would signal that
    unrelated process. Postgres deletes both files itself on a clean shutdown.

    A file is kept whenever its pid may be this data directory's server, or
    cannot be inspected: deleting the lock of a running server would let a
    second postmaster corrupt the data.
    """
    # Untyped; pgserver depends on it, so it is installed whenever we get here.
    import psutil  # type: ignore[import-untyped, unused-ignore]

    for lock in [data_dir / "postmaster.pid", *data_dir.glob(".s.PGSQL.*.lock")]:
        try:
            content = lock.read_text()
            proc = psutil.Process(int(content.split("\n", 1)[0]))
            # A postmaster and its children run in their data directory.
            if proc.status() != psutil.STATUS_ZOMBIE and pathlib.Path(proc.cwd()) == data_dir:
                continue
            # Re-read so a file freshly written by a server that another
            # process has just started is never the one removed.
            if lock.read_text() == content:
                lock.unlink()
                _log.warning("embedded_postgres_stale_lock_removed", path=str(lock))
        except (OSError, ValueError, psutil.Error):
            # No file, a malformed one (pgserver reports it), a pid that is
            # gone (postgres handles that itself) or one we may not inspect.
            continue


def _check_reachable(url: str, data_dir: pathlib.Path, log_file: pathlib.Path) -> None:
    """Fail now, with advice, rather than at the first query."""
    import psycopg

    from eventstore.errors import ConfigurationError

    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise ConfigurationError(
            f"The embedded PostgreSQL in {data_dir} is not reachable at {url}: "
            f"{exc}. Check {log_file}; if no PostgreSQL process is using that "
            f"directory, delete {data_dir / 'postmaster.pid'} and retry. "
            f"{_NEXT_STEP}."
        ) from exc
