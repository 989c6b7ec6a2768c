"""A TCP proxy on loopback that can be cut without closing anything: a network partition between
one client (an Envoy's etcd cluster) and its server (etcd).

While cut, the proxy forwards nothing in either direction and closes nothing: bytes already
received are held in memory, the kernel's buffers fill, new connections are accepted but not
connected onward. To the client it looks like packets being dropped on the way (its calls time
out), not like a refused or reset connection. `restore()` delivers what was held (late, as a
healed network delivers retransmitted segments) and forwards again; `restore(drop=True)`
resets the connections that were open during the cut instead.

Stdlib only: one thread per direction per connection.
"""

from __future__ import annotations

import json
import socket
import struct
import threading


class PausableProxy:
    """Forwards 127.0.0.1:`port` (chosen free) to 127.0.0.1:`target_port`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.flowing = threading.Event()  # set: forwarding; clear: cut
        self.flowing.set()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.held_bytes = 0  # received during cuts (delivered or dropped at restore)
        threading.Thread(target=self._accept, daemon=True).start()

    # -- control ---------------------------------------------------------------------------
    def cut(self) -> None:
        """Stop forwarding; connections stay open."""
        self.flowing.clear()

    def restore(self, drop: bool = False) -> None:
        """Forward again; with `drop`, reset (RST) every connection open now instead of
        delivering what they held."""
        if drop:
            with self.lock:
                conns, self.conns = self.conns, []
            for s in conns:
                _reset(s)
        self.flowing.set()

    def stop(self) -> None:
        self.stopping.set()
        self.flowing.set()
        try:
            self.listener.close()
        except OSError:
            pass
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            _reset(s)

    def cluster(self, direct: dict) -> dict:
        """The static Envoy cluster `direct` (one endpoint, e.g. `Etcd.envoy_cluster()`, TLS
        included: the proxy forwards bytes) through this proxy instead."""
        c = json.loads(json.dumps(direct))
        for group in c["load_assignment"]["endpoints"]:
            for ep in group["lb_endpoints"]:
                ep["endpoint"]["address"]["socket_address"].update(address="127.0.0.1", port_value=self.port)
        return c

    # -- forwarding --------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._wait_flowing()  # a connection made during a cut goes nowhere until it heals
        if self.stopping.is_set():
            return _reset(client)
        try:
            server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            server.settimeout(None)
        except OSError:
            return _reset(client)
        with self.lock:
            self.conns += [client, server]
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _wait_flowing(self) -> None:
        while not self.flowing.wait(0.2):
            if self.stopping.is_set():
                return

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self._wait_flowing()  # cut: not even read (the kernel's buffers fill)
                data = src.recv(65536)
                if not self.flowing.is_set():  # read just before the cut: held
                    with self.lock:
                        self.held_bytes += len(data)
                    self._wait_flowing()
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            _reset(src)
            _reset(dst)


def _reset(s: socket.socket) -> None:
    """Close with a TCP RST."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
