"""A tiny stand-in for huggingface.co serving one model repo from a local folder, logging every
request (time, method, path) so per-request hub traffic of vLLM's front end can be counted.
Usage: python chat_preprocess_fakehub.py PORT REPO_ID FOLDER LOGFILE
Set HF_ENDPOINT=http://127.0.0.1:PORT in the client."""
import hashlib
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

PORT, REPO, FOLDER, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
COMMIT = "0000000000000000000000000000000000000001"
FILES = {f: open(os.path.join(FOLDER, f), "rb").read() for f in sorted(os.listdir(FOLDER))}
ETAG = {f: hashlib.sha256(b).hexdigest() if len(b) > 10_000_000 else hashlib.sha1(b).hexdigest()
        for f, b in FILES.items()}
logf = open(LOG, "a", buffering=1)


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, code, body=b"", headers=None, head=False):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, obj, head=False):
        self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, head)

    def handle_any(self, head):
        u = urlparse(self.path)
        path = unquote(u.path)
        logf.write(f"{time.time():.6f} {self.command} {self.path}\n")
        pre_resolve = f"/{REPO}/resolve/"
        pre_api = f"/api/models/{REPO}"
        if path.startswith(pre_resolve):
            rest = path[len(pre_resolve):]
            _rev, _, fname = rest.partition("/")
            if fname in FILES:
                b = FILES[fname]
                return self._send(200, b, {"X-Repo-Commit": COMMIT, "ETag": f'"{ETAG[fname]}"',
                                           "Content-Type": "application/octet-stream"}, head)
            return self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound",
                                                        "X-Error-Message": "Entry not found",
                                                        "X-Repo-Commit": COMMIT}, head)
        if path.startswith(pre_api):
            rest = path[len(pre_api):]
            if rest.startswith("/tree/"):
                return self._json([{"type": "file", "oid": ETAG[f], "size": len(b), "path": f}
                                   for f, b in FILES.items()], head)
            if rest in ("", "/") or rest.startswith("/revision/"):
                return self._json({"_id": "x", "id": REPO, "modelId": REPO, "sha": COMMIT,
                                   "private": False, "gated": False, "disabled": False,
                                   "tags": [], "pipeline_tag": "text-generation",
                                   "library_name": "transformers",
                                   "siblings": [{"rfilename": f} for f in FILES],
                                   "lastModified": "2025-05-21T00:00:00.000Z",
                                   "createdAt": "2025-04-27T00:00:00.000Z"}, head)
            if rest.startswith("/paths-info/"):
                return self._json([], head)
        return self._send(404, b"not found", {"X-Error-Code": "RepoNotFound"}, head)

    def do_GET(self):
        self.handle_any(False)

    def do_HEAD(self):
        self.handle_any(True)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        self.handle_any(False)


ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
