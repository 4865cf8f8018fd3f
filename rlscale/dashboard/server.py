"""Serving the dashboard's app with uvicorn in the foreground (`rlscale dashboard`), and who may reach it."""

import ipaddress

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
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
