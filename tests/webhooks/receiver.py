"""A webhook receiver for brain/tests/all/webhooks.rs: verifies every delivery with the
official Standard Webhooks library and reports each request as one JSON line on stdout.

Prints `port N` once listening, then reads the signing secret (`whsec_...`, or `-` for
none: unsigned deliveries, which it then does not verify) from one line of stdin.
`--fail N` answers the first N requests 500; `--hang N` never answers the first N
(it holds them open), so the sender times out or dies mid-request.
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

parser = argparse.ArgumentParser()
parser.add_argument("--fail", type=int, default=0)
parser.add_argument("--hang", type=int, default=0)
args = parser.parse_args()

lock = threading.Lock()
seen = 0
webhook = None


def report(line):
    with lock:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        global seen
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with lock:
            seen += 1
            n = seen
        headers = {k.lower(): v for k, v in self.headers.items()}
        verified = None
        if webhook is not None:
            try:
                webhook.verify(body, headers)
                verified = True
            except WebhookVerificationError:
                verified = False
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if n <= args.hang:
            answer = "hang"
        elif n <= args.hang + args.fail:
            answer = 500
        else:
            answer = 204
        report({
            "n": n,
            "id": headers.get("webhook-id"),
            "signed": "webhook-signature" in headers,
            "verified": verified,
            "token": headers.get("x-a2a-notification-token"),
            "authorization": headers.get("authorization"),
            "answer": answer,
            "payload": payload,
        })
        if answer == "hang":
            time.sleep(3600)
            return
        self.send_response(answer)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(f"port {server.server_address[1]}", flush=True)
secret = sys.stdin.readline().strip()
if secret != "-":
    webhook = Webhook(secret)
server.serve_forever()
