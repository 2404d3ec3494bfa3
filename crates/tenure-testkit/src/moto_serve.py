"""Runs moto's S3 and DynamoDB emulation, handling one request at a time.

moto checks the condition of a conditional write (S3 If-Match and If-None-Match, a
DynamoDB ConditionExpression) and then writes, while other requests run in other threads:
on a busy machine two writers conditional on the same version can both succeed, which S3
and DynamoDB never allow. Here each connection still reads its request in its own
thread, and the emulator then handles the requests one after another.

Usage: python3 moto_serve.py HOST PORT
"""

import io
import os
import sys
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

host, port = sys.argv[1], int(sys.argv[2])
os.environ.setdefault("MOTO_PORT", str(port))
emulator = DomainDispatcherApplication(create_backend_app)
one_at_a_time = threading.Lock()


def app(environ, start_response):
    length = environ.get("CONTENT_LENGTH") or ""
    stream = environ["wsgi.input"]
    if length.isdigit():
        body = stream.read(int(length))
        if len(body) != int(length):
            start_response("400 Bad Request", [("Content-Type", "text/plain")])
            return [b"the request body ended early"]
    elif environ.get("wsgi.input_terminated"):
        body = stream.read()
    else:
        body = b""
    environ["wsgi.input"] = io.BytesIO(body)
    with one_at_a_time:
        answer = emulator(environ, start_response)
        try:
            return [b"".join(answer)]
        finally:
            if hasattr(answer, "close"):
                answer.close()


run_simple(host, port, app, threaded=True)
