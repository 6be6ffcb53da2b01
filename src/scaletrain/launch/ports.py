"""Rendezvous ports: check that a port the user fixed is free before workers depend on it.

By default scaletrain never picks a port number itself on one node: the elastic agent's
store binds port 0 and the kernel hands out a free one atomically, so two concurrent
``scaletrain run`` can never race for the same number (a "find a free port, close it, bind
it again" helper could). A fixed port (``--master-port`` or ``MASTER_PORT``) is the user's
choice, and when something already listens there the run fails at once with the fix,
instead of as a rendezvous timeout many seconds later.
"""

from __future__ import annotations

import errno
import socket

from scaletrain.errors import LaunchError
# torchrun's default, used when several nodes must agree on a port and none was given; the
# runtime assumes the same one.


def port_is_free(port: int) -> bool:
    """True when a TCP server could listen on ``port`` now, on IPv4 and (if present) IPv6."""
    for family, host in ((socket.AF_INET, ""), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this machine
            continue
        with sock:
            # TCPStore sets SO_REUSEADDR too: a port in TIME_WAIT is usable, a listener is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return False
                # EADDRNOTAVAIL etc.: this family is unusable here, which is not "in use"
    return True


def check_port_free(port: int, *, where: str) -> None:
    """Raise LaunchError naming ``where`` the port came from when it is taken."""
    if not port_is_free(port):
        raise LaunchError(
            f"port {port} ({where}) is already in use on this machine",
            "pick another with --master-port P (or unset MASTER_PORT to let scaletrain "
            "choose a free one on a single node); `ss -ltnp | grep :PORT` shows who holds it",
        )
