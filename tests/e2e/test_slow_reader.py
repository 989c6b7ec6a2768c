"""A client that never reads a response that fits Envoy's buffers cannot keep seats.

kube-apiserver frees a request's seats when its handler returns, whatever the client does with
the response; the gateway does the same when the upstream's response has ended, not when the
downstream stream does. This holds for responses Envoy can take whole into its buffers (about
1 MiB per stream and connection by default). A client that stops reading a larger one, say a
20 MB LIST, does hold its seats: Envoy's flow control stops reading from the upstream, whose
response then does not end, until `stream_idle_timeout` resets the stream. kube-apiserver does
the same: its handler blocks writing the LIST to a client that does not read, and the seats are
freed only when it returns.

The attacker here speaks raw HTTP/2 (the `h2` package): it advertises a zero stream receive
window (SETTINGS_INITIAL_WINDOW_SIZE = 0) and never sends WINDOW_UPDATE, so Envoy can deliver
response headers but no body and none of its streams ever ends downstream. It opens ten times as
many streams as its level has seats. The upstream answers each at once with a small body; every
stream must then be answered (the queued ones too, as seats come back), the level's executing
seats must be back to zero while all those streams are still open, and another user must be
served at once.
"""

from __future__ import annotations

import socket
import threading
import time

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from apfkit.apf_policy import E2E_GROUP, single_level_config
from apfkit.envoyproc import wait_until
from apfkit.observe import level_rows

pytestmark = pytest.mark.apf

SEATS = 4
STREAMS = 10 * SEATS
LEVEL = "e2e-level"
PODS = "/api/v1/namespaces/default/pods"


class ZeroWindowClient:
    """One HTTP/2 (prior knowledge) connection whose streams get no receive window, ever."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0,
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
        })
        self.lock = threading.Lock()
        self.status: dict[int, str] = {}   # stream → :status of its response headers
        self.ended: set[int] = set()       # streams that ended (END_STREAM or reset)
        self.data_bytes = 0
        self.closed = False
        with self.lock:
            self.conn.initiate_connection()
            self.sock.sendall(self.conn.data_to_send())
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def get(self, path: str, user: str, groups: tuple[str, ...]) -> int:
        with self.lock:
            sid = self.conn.get_next_available_stream_id()
            headers = [(":method", "GET"), (":scheme", "http"), (":authority", "gateway"),
                       (":path", path), ("x-remote-user", user)]
            headers += [("x-remote-group", g) for g in groups]
            self.conn.send_headers(sid, headers, end_stream=True)
            self.sock.sendall(self.conn.data_to_send())
        return sid

    def _read(self) -> None:
        self.sock.settimeout(None)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                with self.lock:
                    for ev in self.conn.receive_data(data):
                        if isinstance(ev, h2.events.ResponseReceived):
                            self.status[ev.stream_id] = dict(ev.headers).get(":status", "")
                        elif isinstance(ev, h2.events.DataReceived):
                            # Never acknowledged: no WINDOW_UPDATE is ever sent.
                            self.data_bytes += len(ev.data)
                        elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                            self.ended.add(ev.stream_id)
                    # SETTINGS and PING acknowledgements only.
                    self.sock.sendall(self.conn.data_to_send())
        except OSError:
            pass
        finally:
            self.closed = True

    def answered(self) -> dict[str, int]:
        with self.lock:
            out: dict[str, int] = {}
            for s in self.status.values():
                out[s] = out.get(s, 0) + 1
            return out

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def in_level(gw) -> tuple[int, int]:
    """(waiting, executing) requests of the level, from dump_priority_levels."""
    row = level_rows(gw)[LEVEL]
    return int(row["WaitingRequests"]), int(row["ExecutingRequests"])


@pytest.mark.parametrize("workers", [1, 2])
def test_zero_window_http2_client_keeps_no_seats(gateway, workers):
    gw = gateway(single_level_config(SEATS, queues=16, hand_size=4, queue_length_limit=50),
                 concurrency=workers)
    attacker = ZeroWindowClient(gw.port)
    try:
        t0 = time.monotonic()
        for _ in range(STREAMS):
            attacker.get(PODS, "mallory", (E2E_GROUP,))
        # Every stream is answered: the first SEATS at once, the others as seats come back when
        # the upstream's responses end. Before, SEATS streams were answered and the rest waited
        # for their queue time-out (15 s) and got 429.
        try:
            wait_until(lambda: sum(attacker.answered().values()) == STREAMS, timeout=10,
                       what=f"all {STREAMS} streams answered")
        except TimeoutError:
            pytest.fail(gw.fail_msg(f"{attacker.answered()} of {STREAMS} streams answered in 10 s;"
                                    f" level (waiting, executing) = {in_level(gw)}"))
        answered_in = time.monotonic() - t0
        assert attacker.answered() == {"200": STREAMS}, gw.fail_msg(f"{attacker.answered()}")
        assert gw.upstream.snapshot()["total"] == STREAMS
        # The level's seats are back — within one timer tick of the last response — while
        # every one of the attacker's streams is still open downstream.
        t_answered = time.monotonic()
        wait_until(lambda: in_level(gw) == (0, 0), timeout=1.0,
                   what=f"nothing waiting or executing (now {in_level(gw)})")
        back_in = time.monotonic() - t_answered
        with attacker.lock:
            open_streams = STREAMS - len(attacker.ended)
            body = attacker.data_bytes
        assert not attacker.closed and open_streams == STREAMS, \
            f"the attacker's streams ended ({open_streams} open, closed={attacker.closed})"
        assert body == 0, f"{body} body bytes reached a zero-window client"
        # Another user is served at once, with nothing queued behind the attacker.
        r = gw.request(PODS, user="alice", groups=(E2E_GROUP, "e2e-explain"), timeout=5)
        assert r.status == 200, gw.fail_msg(f"another user: {r!r}")
        assert r.headers.get("x-apf-queued-ms") == "0", r.headers
        print(f"workers={workers}: {STREAMS} streams answered in {answered_in:.2f}s, "
              f"seats back {back_in * 1000:.0f} ms after, {open_streams} streams still open")
    finally:
        attacker.close()
    # Disconnecting leaves nothing behind either.
    wait_until(lambda: in_level(gw) == (0, 0), timeout=5, what="nothing executing after close")
