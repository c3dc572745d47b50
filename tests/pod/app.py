"""The application container of the pod replica (tests/pod.rs): an HTTP server on port 8080 that,
as real applications do, calls another service of the mesh on every request. Run as an
unprivileged user, its outgoing connections are captured by the sidecar's iptables rules.

  GET /call/<seconds>   calls http://10.90.0.3:9080/delay/<seconds> (the other namespace), then
                        answers 200 with what it got
  GET /local/<seconds>  answers 200 after <seconds>, calling nothing; <low>-<high> seconds: a
                        time drawn evenly between them for each request
  GET /bytes/<n>        answers 200 with <n> bytes at once, calling nothing (a download)

A query string (`/local/10?long=1`) only tells requests apart; one that holds `probe` is the
kubelet's, which a graceful shutdown does not take for traffic; one that holds `reset` has the
app close the connection after its answer with a reset (SO_LINGER 0), as servers do on errors.

On SIGTERM it does what the first argument says, then exits once its requests are done:
  serve     go on serving until killed
  close     close its listener at once, finishing the requests in flight (nginx's way)
  call      make one last HTTP call through the sidecar (a deregistration, say) taking 1.5 s
  tcp       make one last TCP exchange through the sidecar (10.90.0.3:5432) taking 1.5 s
  graceful  keep serving until its endpoint is gone: no request in flight and none arrived for
            QUIET seconds, counted from SIGTERM at the earliest (clients have stopped sending),
            then close the listener
  flush     the same, with one last HTTP call through the sidecar (1.5 s) at SIGTERM
  worker    close its listener at once, work alone for WORK seconds holding no socket (a queue
            written to disk, a timer), then make one last HTTP call through the sidecar (1.5 s)

Every event is a line on stdout, for the test to wait on: `listening`, `received <path>`,
`answered <path> <status>`, `closed listener`, `last call <result>`, `exiting`.
"""

import http.client
import http.server
import random
import signal
import socket
import struct
import sys
import threading
import time

SERVICE = ("10.90.0.3", 9080)
DATABASE = ("10.90.0.3", 5432)

# Requests being answered: a graceful shutdown waits for these, not for idle keep-alive
# connections (Envoy keeps its pool to the app open).
in_flight = 0
last_arrival = time.monotonic()
quiet = threading.Condition()
# How long a graceful app hears nothing before it takes its endpoint for gone.
QUIET = 1.0
# How long a worker works alone between closing its listener and its last call.
WORK = 2.0


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def call(path):
    conn = http.client.HTTPConnection(*SERVICE, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def exchange():
    with socket.create_connection(DATABASE, timeout=30) as conn:
        conn.sendall(b"wait 1.5\n")
        return conn.makefile().readline().strip()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        global in_flight, last_arrival
        # The kubelet's probes are not traffic: they go on while the pod terminates.
        if "probe" in self.path:
            return self.answer()
        with quiet:
            in_flight += 1
            last_arrival = time.monotonic()
        try:
            self.answer()
        finally:
            with quiet:
                in_flight -= 1
                quiet.notify_all()

    def answer(self):
        say("received " + self.path)
        kind, _, seconds = self.path.partition("?")[0].strip("/").partition("/")
        low, _, high = seconds.partition("-")
        try:
            delay = random.uniform(float(low), float(high)) if high else float(low)
        except ValueError:
            delay = 0.0
        status, body = 200, b"ok\n"
        if kind == "bytes":
            body, delay = b"x" * int(seconds), 0.0
        if kind == "call":
            got, reply = call("/delay/%s" % delay)
            status, body = (200, b"app: " + reply) if got == 200 else (502, b"call failed\n")
        else:
            time.sleep(delay)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        say("answered %s %d" % (self.path, status))
        if "reset" in self.path:
            self.close_connection = True

    def finish(self):
        super().finish()
        # Closed here, before the server's shutdown(SHUT_WR) could send a FIN: a reset straight
        # from ESTABLISHED, which leaves no socket at either end.
        if self.close_connection and "reset" in getattr(self, "path", ""):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def log_message(self, *args):
        pass


def main():
    global last_arrival
    on_sigterm = sys.argv[1] if len(sys.argv) > 1 else "serve"
    # A listen backlog as servers set it (nginx 511); Python's default of 5 drops connections
    # that arrive in a burst.
    http.server.ThreadingHTTPServer.request_queue_size = 128
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Handler)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    serving = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    serving.start()
    say("listening")
    stopping.wait()
    stopped_at = time.monotonic()
    if on_sigterm == "serve":
        threading.Event().wait()
    if on_sigterm in ("close", "worker"):
        server.shutdown()
        server.socket.close()
        say("closed listener")
    if on_sigterm == "worker":
        time.sleep(WORK)
    try:
        if on_sigterm in ("call", "flush", "worker"):
            status, _ = call("/delay/1.5")
            say("last call %d" % status)
        elif on_sigterm == "tcp":
            say("last call %s" % exchange())
    except OSError as e:
        say("last call failed: %s" % e)
    if on_sigterm in ("graceful", "flush"):
        with quiet:
            last_arrival = max(last_arrival, stopped_at)
            while not (in_flight == 0 and time.monotonic() - last_arrival >= QUIET):
                quiet.wait(timeout=max(0.01, QUIET - (time.monotonic() - last_arrival)))
        say("endpoint gone")
    server.shutdown()
    server.socket.close()
    with quiet:
        quiet.wait_for(lambda: in_flight == 0)
    say("exiting")


if __name__ == "__main__":
    main()
