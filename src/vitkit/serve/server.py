"""Where the application listens: a socket bound before the model is loaded (a port in use is said at once), and
uvicorn's server ended by SIGTERM or SIGINT as a server's normal end."""

from __future__ import annotations

import errno
import ipaddress
import signal
import socket

import uvicorn
from starlette.applications import Starlette

from ..errors import ConfigError


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (port 0: one the system picks) and listening, so that a client
    that connects while the model loads waits rather than being refused; ``OSError`` naming the address when it
    cannot be had (a port in use, an address this machine does not have)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET  # a host name, resolved by bind
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # from now on connections wait in the backlog until the server takes them
    except UnicodeError:
        sock.close()
        raise ConfigError(f"--host {host!r}: not an address or a host name") from None
    except OSError as error:
        sock.close()
        hint = "; stop the process using it or pick another --port" if error.errno == errno.EADDRINUSE else ""
        raise OSError(error.errno, f"cannot listen on {host}:{port}: {error.strerror or error}{hint}") from None
    return sock


class GracefulServer(uvicorn.Server):
    """uvicorn's server, for which SIGTERM or SIGINT is the normal end: it stops accepting, answers every request
    already accepted and returns, so the process exits 0. (uvicorn itself raises the signal again after its
    shutdown, which would end the process with 143 or 130, the statuses of a command cut short.)"""

    def handle_exit(self, sig: int, frame) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop without waiting for the requests
        self.should_exit = True


def serve(app: Starlette, sock: socket.socket) -> None:
    """Serve ``app`` on the bound ``sock`` until SIGTERM or SIGINT (uvicorn's own logging: warnings and up)."""
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    GracefulServer(config).run(sockets=[sock])
