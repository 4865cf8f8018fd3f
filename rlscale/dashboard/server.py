"""Serving the dashboard's app with uvicorn in the foreground (`rlscale dashboard`), and who may reach it."""

import errno
import ipaddress
import socket

from rlscale.base.errors import UserError

LOOPBACK_NAMES = {"localhost"}


def is_loopback(host: str) -> bool:
    """Whether `host` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def check_exposure(host: str, token: str | None) -> None:
    """UserError when the dashboard would listen beyond this machine without a token."""
    if not is_loopback(host) and not token:
        raise UserError(
            f"listening on {host} shows the store to the network: give --token TOKEN (or "
            "RLSCALE_DASHBOARD_TOKEN), e.g. --token $(python -c 'import secrets; "
            "print(secrets.token_urlsafe(24))')",
            field="--host",
        )


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: a free one), for `serve`; UserError naming --port when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)  # listening at once: a second dashboard on this port is refused here, not later
    except OSError as err:
        sock.close()
        field = "--port" if err.errno in (errno.EADDRINUSE, errno.EACCES) else "--host"  # else the address is wrong
        raise UserError(f"cannot listen on {host}:{port}: {err.strerror or err}", field=field) from None
    return sock


def serve(app, sock: socket.socket) -> None:
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])
