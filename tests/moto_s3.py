"""moto's S3 server, with each S3 request handed straight to moto's S3 app: ``python tests/moto_s3.py PORT``.

``moto.server`` finds the service of every request anew: it parses the signature's credential scope, then lists
moto's package folder (a ``stat`` of each of its ~200 service folders) and matches the host against every
service's URL patterns. That costs more server CPU than most S3 requests themselves. Here a request whose
signature names ``s3`` goes to moto's S3 app (the one ``moto.server`` would pick for it), built once; any other
request (``/moto-api/``, other services, unsigned ones) goes through moto's own dispatch. Requests that write
(PUT, POST, DELETE) are handled one at a time: moto checks a conditional put's ``If-Match`` /
``If-None-Match`` and then stores, with no lock between, so on its threaded server two conditional puts of one
key could both succeed (about one race in 1,500 here), where S3 lets exactly one win; locks and Delta commits
rely on that. Each request's line
is not logged (``moto.server`` logs it to a stream nobody reads). Serves on 127.0.0.1, threaded, as
``moto.server`` does.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

from flask import Flask
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple


class S3First(DomainDispatcherApplication):
    """moto's dispatcher, which hands a request signed for ``s3`` to moto's S3 app without looking further."""

    def __init__(self) -> None:
        super().__init__(create_backend_app)
        self.s3 = create_backend_app("s3")
        self.writes = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") in ("PUT", "POST", "DELETE"):
            with self.writes:  # a conditional put's check and its store, atomic as on S3
                return super().__call__(environ, start_response)
        return super().__call__(environ, start_response)

    def get_application(self, environ: dict[str, Any]) -> Flask:
        scope = environ.get("HTTP_AUTHORIZATION", "").split(",", 1)[0].split("/")
        path = environ.get("PATH_INFO", "")
        if len(scope) == 5 and scope[3] == "s3" and not path.startswith(("/moto-api", "/v20180820/")):
            return self.s3
        return super().get_application(environ)


def main(port: int) -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = S3First()
    app.debug = True  # type: ignore[attr-defined]
    run_simple("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(int(sys.argv[1]))
