"""optuna-dashboard on localhost for a study's storage: the live, interactive view of a search."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dse.report import open_existing_storage

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication


def dashboard_app(storage_url: str) -> WSGIApplication:
    """optuna-dashboard's WSGI application over an existing storage (sqlite, journal or RDB).

    It serves every study of the storage, the confirmation studies included. Its REST API
    (e.g. GET /api/studies) is what the page in the browser calls. Raises ConfigError when a
    sqlite or journal file does not exist.
    """
    from optuna_dashboard import wsgi

    return wsgi(open_existing_storage(storage_url))


def dashboard_url(host: str = "127.0.0.1", port: int = 8080) -> str:
    """Where serve_dashboard's page is."""
    return f"http://{host}:{port}/dashboard"


def serve_dashboard(storage_url: str, *, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve optuna-dashboard for the storage on host:port until interrupted (Ctrl-C).

    Binds to localhost by default: the dashboard can edit studies and has no authentication.
    Note that optuna-dashboard's best-trials list ignores the SLO constraints; the report is
    authoritative on which configurations are feasible.
    """
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class _QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            """No line per request on the terminal."""

    app = dashboard_app(storage_url)
    with make_server(host, port, app, handler_class=_QuietHandler) as server:
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
