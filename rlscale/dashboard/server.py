"""Serving the dashboard's app with uvicorn: in the foreground (`rlscale dashboard`) or on a thread (tests, bench)."""

import ipaddress
import threading
import time

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


def serve(app, host: str, port: int) -> None:
    """Serve `app` until Ctrl-C."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


class Background:
    """`app` served on a thread of this process, on a free port of 127.0.0.1 (port 0) unless given; a context
    manager whose `url` is the server's address, stopped on exit."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on")
        )
        self.thread = threading.Thread(target=self.server.run, name="dashboard", daemon=True)
        self.url = ""

    def __enter__(self) -> "Background":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.02)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}/"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
