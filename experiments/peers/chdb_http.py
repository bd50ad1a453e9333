#!/usr/bin/env python3
"""A current ClickHouse engine (PyPI `chdb`, embedded) behind the part of ClickHouse's HTTP
interface promlab's cluster client speaks, on loopback, so the very statements, inserts and
queries of `promlab_lab::cluster` run unchanged on it (experiments/lab/tests/cluster_current.rs
checks their answers equal to ClickHouse 18.16's).

What is served: `POST /?[query=SQL&][setting=value&...]` with the SQL in `query` (then the body
is the insert's data, `INSERT … FORMAT RowBinary`) or in the body. Settings are applied to the
session before the statement. An error answers 500 with ClickHouse's own message (`Code: N. …`).
Statements run one at a time (one chDB session).

chDB has no server of its own: the cluster named by `--cluster` is written to its config as one
shard at localhost on the config's `tcp_port`, which ClickHouse recognises as itself, so a
`Distributed` table over it reads the local tables without a network hop.

usage: chdb_http.py --dir DIR [--cluster NAME]
prints: `listening PORT` on its first line once it answers; exits when its stdin closes.
"""

import argparse
import os
import re
import sys
import tempfile
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from chdb import session as chs

CONFIG = """<clickhouse>
  <tcp_port>9000</tcp_port>
  <remote_servers>
    <{cluster}><shard><replica><host>localhost</host><port>9000</port></replica></shard></{cluster}>
  </remote_servers>
</clickhouse>
"""

INSERT = re.compile(r"^\s*INSERT\s+INTO\s+(.+?)\s+FORMAT\s+RowBinary\s*$", re.I | re.S)
SETTING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# HTTP parameters that are not settings.
NOT_SETTINGS = {"query", "database", "user", "password", "query_id", "default_format"}


def literal(text):
    """A ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Engine:
    def __init__(self, directory, cluster):
        os.makedirs(directory, exist_ok=True)
        config = os.path.join(directory, "config.xml")
        with open(config, "w") as f:
            f.write(CONFIG.format(cluster=cluster))
        self.scratch = os.path.join(directory, "inserts")
        os.makedirs(self.scratch, exist_ok=True)
        self.session = chs.Session(f"file:{os.path.join(directory, 'data')}?config-file={config}")
        self.lock = threading.Lock()

    def run(self, params, body):
        """The statement's output, as the HTTP interface answers it."""
        with self.lock:
            for name, value in params.items():
                if name in NOT_SETTINGS:
                    continue
                if not SETTING.match(name):
                    raise ValueError(f"not a setting name: {name!r}")
                self.session.query(f"SET {name} = {literal(value)}")
            if "query" not in params:
                return self.session.query(body.decode(), "TabSeparated").bytes()
            insert = INSERT.match(params["query"])
            if insert is None:
                # A query in the URL with a body: ClickHouse appends the body to it.
                sql = params["query"] + ("\n" + body.decode() if body else "")
                return self.session.query(sql, "TabSeparated").bytes()
            # The data goes through a file: chDB takes no request body.
            with tempfile.NamedTemporaryFile(dir=self.scratch, suffix=".bin") as f:
                f.write(body)
                f.flush()
                self.session.query(
                    f"INSERT INTO {insert.group(1)} FROM INFILE {literal(f.name)} FORMAT RowBinary"
                )
            return b""


def handler(engine):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            query = urllib.parse.urlsplit(self.path).query
            params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                out, status = engine.run(params, body), 200
            except Exception as e:  # chDB's errors carry ClickHouse's `Code: N.` text
                out, status = str(e).encode(), 500
            self.send_response(status)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *_):
            pass

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True, help="chDB's data and config directory")
    parser.add_argument("--cluster", default="promlab", help="the cluster Distributed tables name")
    args = parser.parse_args()
    engine = Engine(args.dir, args.cluster)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(engine))
    # Whoever started it holds its stdin: at EOF (it stopped or died) the server exits.
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    print(f"listening {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
