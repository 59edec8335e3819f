#!/usr/bin/env python3
"""Load test of serve_gpt on loopback (CTest e2e_serve_load): a tiny GPT (inputs/gpt_tiny_ci.ini at its
initial weights: one step at lr 0, so that greedy answers differ by prompt and along the sequence; the
context is 64 positions) served with --max-batch 8, a bounded --max-queue and --max-body-bytes 4096.

  1. one at a time: the reference answers of a fixed set of requests (greedy, and seeded sampling with
     n = 2), with their log-probabilities and the smallest top-2 gap of the greedy tokens (how far from a
     near-tie greedy decoding is);
  2. the same requests (without log-probabilities) one at a time and all at once (continuous batching):
     every answer its reference; tokens/s of both and their ratio are printed, not asserted;
  3. the load: --clients threads (36), each with its own time limit, doing --rounds (6) requests: good ones
     (greedy and seeded sampled against their references, unseeded sampled, streaming and not, n = 1 and
     2, some on kept-alive connections, some streams dropped by the client after their first chunk;
     log-probabilities within 1e-4 of one at a time: batching changes the row count of the decode GEMMs
     and with it their rounding, by ~1e-7 here, printed) and
     bad ones (malformed JSON, an unknown field, wrong types, max_tokens 0, temperature -1, prompts over
     the context, max_tokens over the room the prompt leaves, n over the batch, a body over
     --max-body-bytes, an unknown model, an unknown endpoint). No good request may fail; a 503 must carry
     Retry-After and a JSON error, and is retried after that delay (at most --max-attempts tries); every
     bad request gets its 4xx with a JSON error body naming the field;
  4. afterwards: /health answers ok, a greedy request one at a time gives its reference bit for bit
     (log-probabilities included: nothing left over from the load), the peak RSS (VmHWM) stays below the
     RSS right after start-up + --rss-margin-mib (200);
  5. SIGTERM while streams are running: they finish complete, and the server exits 0.

usage: serve_load.py --build BUILD --shards GLOB --work DIR [--clients 36] [--rounds 6]
Exit 0: passed (the work directory is removed); 1: failed (it is kept, with the server's log); 77: skipped
(no /proc to read the server's memory from).
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from testlib import run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = "trident-gpt"
CONTEXT = 64  # inputs/gpt_tiny_ci.ini: max_position_embeddings
MAX_BATCH = 8
MAX_BODY = 4096
LOGPROB_TOL = 1e-4

# The reference requests (step 1); steps 2 and 3 send the same bodies
GREEDY = [("In the beginning", 40), ("And God said", 32), ("The LORD is my shepherd", 40),
          ("Blessed are the", 24), ("And it came to pass", 40), ("Hear, O Israel", 16),
          ("Café — naïve señor Ω", 32), ("For God so loved", 40)]
SAMPLED = [("Now the serpent was", 24, 0.8, 7, {"top_k": 40}), ("In the beginning", 24, 1.0, 11, {}),
           ("Let there be light", 16, 0.7, 23, {"top_p": 0.9}), ("And Moses said", 24, 1.3, 5, {})]


def greedy_body(i, **extra):
    p, mt = GREEDY[i]
    return dict({"prompt": p, "max_tokens": mt, "temperature": 0}, **extra)


def sampled_body(i, **extra):
    p, mt, temp, seed, more = SAMPLED[i]
    return dict({"prompt": p, "max_tokens": mt, "temperature": temp, "seed": seed, "n": 2}, **more, **extra)


# ---------------------------------------------------------------------------------------------
# The server


class Server:
    def __init__(self, app, args, log, env=None):
        self.log_path = log
        self.logf = open(log, "w")
        self.cmd = [app] + args
        self.p = subprocess.Popen(self.cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=env)
        self.port = None
        t0 = time.time()
        while time.time() - t0 < 60:
            m = re.search(r"serve_gpt: model '([^']*)' listening on http://127\.0\.0\.1:(\d+)", self.log())
            if m:
                assert m.group(1) == MODEL, m.group(0)
                self.port = int(m.group(2))
                break
            if self.p.poll() is not None:
                raise AssertionError(f"serve_gpt exited with {self.p.returncode} at start-up:\n{self.log()}")
            time.sleep(0.05)
        if not self.port:
            self.kill()
            raise AssertionError(f"serve_gpt printed no 'listening' line in 60 s:\n{self.log()}")

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def status_kib(self, key):
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise AssertionError(f"no {key} in /proc/{self.p.pid}/status")

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.logf.close()


# ---------------------------------------------------------------------------------------------
# HTTP (http.client; a fresh connection per request unless a kept-alive one is passed)


class Reply:
    def __init__(self, status, headers, body, events=None, t_first=None, t_end=None):
        self.status, self.headers, self.body, self.events = status, headers, body, events
        self.t_first, self.t_end = t_first, t_end

    def json(self):
        return json.loads(self.body)


class Conn:
    """One client's connection: kept alive between requests when `keep`, else one per request."""

    def __init__(self, port, keep=False, timeout=30):
        self.port, self.keep, self.timeout, self.c = port, keep, timeout, None

    def _conn(self):
        if self.c is None:
            self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        return self.c

    def close(self):
        if self.c is not None:
            self.c.close()
            self.c = None

    def request(self, method, path, body=None, stream=False, abandon=False):
        """body: a dict (sent as JSON), bytes or None. stream: read server-sent events (each with the
        seconds since the request was sent); abandon: close the connection after the first event."""
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        c = self._conn()
        t0 = time.time()
        try:
            c.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
            r = c.getresponse()
            headers = {k.lower(): v for k, v in r.getheaders()}
            if not stream or r.status != 200:
                data = r.read()
                if not self.keep or r.will_close:
                    self.close()
                return Reply(r.status, headers, data, t_end=time.time() - t0)
            events, t_first = [], None
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.decode().rstrip("\r\n")
                if not line:
                    continue
                assert line.startswith("data: "), f"not a server-sent event: {line!r}"
                payload = line[len("data: "):]
                events.append((time.time() - t0, payload))
                if t_first is None and payload != "[DONE]" and any(ch.get("text") for ch in json.loads(payload)["choices"]):
                    t_first = time.time() - t0
                if abandon:
                    break
            if abandon or not self.keep or r.will_close:
                self.close()
            return Reply(r.status, headers, b"", events, t_first, time.time() - t0)
        except BaseException:
            self.close()
            raise


def sse_choices(reply, n):
    """A complete stream of n choices: the texts and finish reasons, checked for shape (every chunk
    a text_completion of this model, one finish_reason per choice and nothing after it, [DONE] last)."""
    assert reply.headers.get("content-type", "").startswith("text/event-stream"), reply.headers
    assert reply.events and reply.events[-1][1] == "[DONE]", f"the stream did not end with [DONE]: {reply.events[-3:]}"
    texts, finish, ids = [""] * n, [None] * n, set()
    for _, payload in reply.events[:-1]:
        j = json.loads(payload)
        assert j["object"] == "text_completion" and j["model"] == MODEL, j
        ids.add(j["id"])
        for ch in j["choices"]:
            i = ch["index"]
            assert 0 <= i < n, j
            assert finish[i] is None, f"choice {i} has a chunk after its finish_reason: {j}"
            texts[i] += ch["text"]
            finish[i] = ch["finish_reason"]
    assert len(ids) == 1, f"the chunks carry several ids: {ids}"
    assert all(f in ("length", "stop") for f in finish), f"finish reasons {finish}"
    return texts, finish


def full_choices(reply, n):
    """A non-streamed response of n choices, checked for shape: texts, finish reasons, log-probabilities."""
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    j = reply.json()
    assert j["object"] == "text_completion" and j["model"] == MODEL and j["id"].startswith("cmpl-"), j
    chs = sorted(j["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in chs] == list(range(n)), j
    assert all(c["finish_reason"] in ("length", "stop") for c in chs), j
    u = j["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["completion_tokens"] >= n, u
    lps = [c["logprobs"]["token_logprobs"] if c.get("logprobs") else None for c in chs]
    return [c["text"] for c in chs], [c["finish_reason"] for c in chs], lps, u


def error_of(reply, status, param=None):
    """A 4xx/5xx with a JSON error body of OpenAI's shape; param: the field it must name."""
    assert reply.status == status, f"status {reply.status}, expected {status}: {reply.body[:300]!r}"
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    e = reply.json()["error"]
    assert isinstance(e["message"], str) and e["message"], e
    assert isinstance(e["type"], str) and e["type"], e
    assert "param" in e and "code" in e, e
    if param is not None:
        assert e["param"] == param, f"param {e['param']!r}, expected {param!r}: {e}"
    return e


# ---------------------------------------------------------------------------------------------
# The bad requests: (name, method, path, body, expected status, expected param)

def bad_requests():
    over = " the" * 70  # 70 tokens: no room left in the 64 positions
    return [
        ("malformed JSON", "POST", "/v1/completions", b'{"prompt": "In the", "max_tokens": ', 400, None),
        ("not an object", "POST", "/v1/completions", b'["In the beginning"]', 400, None),
        ("unknown field", "POST", "/v1/completions", {"prompt": "In the", "max_token": 4}, 400, "max_token"),
        ("max_tokens a string", "POST", "/v1/completions", {"prompt": "In the", "max_tokens": "4"}, 400, "max_tokens"),
        ("max_tokens a float", "POST", "/v1/completions", {"prompt": "In the", "max_tokens": 4.5}, 400, "max_tokens"),
        ("prompt a number", "POST", "/v1/completions", {"prompt": 17, "max_tokens": 4}, 400, "prompt"),
        ("temperature a string", "POST", "/v1/completions", {"prompt": "In", "temperature": "hot"}, 400, "temperature"),
        ("stream a string", "POST", "/v1/completions", {"prompt": "In", "stream": "yes"}, 400, "stream"),
        ("max_tokens 0", "POST", "/v1/completions", {"prompt": "In the", "max_tokens": 0}, 400, "max_tokens"),
        ("temperature -1", "POST", "/v1/completions", {"prompt": "In the", "temperature": -1}, 400, "temperature"),
        ("prompt over the context", "POST", "/v1/completions", {"prompt": over, "max_tokens": 4}, 400, "prompt"),
        ("prompt ids fill the context", "POST", "/v1/completions", {"prompt": list(range(100, 100 + CONTEXT))},
         400, "prompt"),
        ("max_tokens over the room", "POST", "/v1/completions", {"prompt": " the" * 60, "max_tokens": 10},
         400, "max_tokens"),
        ("n over the batch", "POST", "/v1/completions", {"prompt": "In", "n": MAX_BATCH + 1}, 400, "n"),
        ("body over --max-body-bytes", "POST", "/v1/completions",
         {"prompt": "In the beginning " * (MAX_BODY // 17 + 20), "max_tokens": 1}, 413, None),
        ("unknown model", "POST", "/v1/completions", {"prompt": "In", "model": "gpt-4"}, 404, "model"),
        ("unknown endpoint", "POST", "/v1/complete", {"prompt": "In"}, 404, None),
    ]


# ---------------------------------------------------------------------------------------------
# The run

class Ctx:
    def __init__(self, a):
        self.a = a
        self.failures = []
        self.lock = threading.Lock()
        self.stats = {}

    def fail(self, what):
        with self.lock:
            self.failures.append(what)

    def count(self, key, k=1):
        with self.lock:
            self.stats[key] = self.stats.get(key, 0) + k


def send_good(ctx, conn, method, path, body, stream=False, abandon=False):
    """Sends a good request, retrying a 503 after its Retry-After (checked) up to --max-attempts times."""
    for attempt in range(ctx.a.max_attempts):
        r = conn.request(method, path, body, stream=stream, abandon=abandon)
        if r.status != 503:
            with ctx.lock:
                ctx.stats["most tries"] = max(ctx.stats.get("most tries", 0), attempt + 1)
            return r
        e = error_of(r, 503)
        ra = r.headers.get("retry-after")
        assert ra is not None and ra.isdigit(), f"a 503 without a Retry-After in seconds: {r.headers}"
        assert "capacity" in e["message"], e
        if attempt + 1 == ctx.a.max_attempts:
            break
        ctx.count("503 retries")
        time.sleep(int(ra))
    raise AssertionError(f"still 503 after {ctx.a.max_attempts} tries: {body}")


def check_logprobs(ctx, got, want, what):
    if got is None or want is None:
        return
    assert len(got) == len(want), f"{what}: {len(got)} log-probabilities, the reference {len(want)}"
    d = max((abs(x - y) for x, y in zip(got, want)), default=0.0)
    with ctx.lock:
        ctx.stats["largest log-probability difference"] = max(ctx.stats.get("largest log-probability difference", 0.0), d)
    assert d <= LOGPROB_TOL, f"{what}: log-probabilities differ from one at a time by {d:.3g}"


def references(ctx, port):
    """Step 1: every reference request one at a time, with log-probabilities. Returns {key: (texts,
    finish reasons, log-probabilities)}."""
    conn = Conn(port)
    ref, gaps = {}, []
    for i in range(len(GREEDY)):
        r = conn.request("POST", "/v1/completions", greedy_body(i, logprobs=2))
        assert r.status == 200, (r.status, r.body)
        texts, fin, lps, u = full_choices(r, 1)
        assert fin == ["length"] or fin == ["stop"], fin
        for t in r.json()["choices"][0]["logprobs"]["top_logprobs"]:
            v = sorted(t.values(), reverse=True)
            if len(v) > 1:
                gaps.append(v[0] - v[1])
        ref[("g", i)] = (texts, fin, lps)
    for i in range(len(SAMPLED)):
        r = conn.request("POST", "/v1/completions", sampled_body(i, logprobs=0))
        assert r.status == 200, (r.status, r.body)
        texts, fin, lps, u = full_choices(r, 2)
        ref[("s", i)] = (texts, fin, lps)
    distinct = len({ref[("g", i)][0][0] for i in range(len(GREEDY))})
    print(f"references, one at a time: {len(GREEDY)} greedy and {len(SAMPLED)} seeded n=2 requests; {distinct} "
          f"distinct greedy texts, e.g. {ref[('g', 0)][0][0][:60]!r}; smallest top-2 log-probability gap of a "
          f"greedy token {min(gaps):.2e} (batching moves log-probabilities by ~1e-7)")
    assert distinct == len(GREEDY), "the greedy answers do not depend on the prompt: a degenerate model"
    return ref


def timed(ctx, port, ref, at_once):
    """Step 2: the reference requests (without log-probabilities) one at a time or all at once; each
    answer must be its reference. Returns (completion tokens, seconds, 503 retries)."""
    keys = [("g", i) for i in range(len(GREEDY))] + [("s", i) for i in range(len(SAMPLED))]
    out, errs = {}, []
    retries0 = ctx.stats.get("503 retries", 0)

    def one(k):
        try:
            body = greedy_body(k[1]) if k[0] == "g" else sampled_body(k[1])
            r = send_good(ctx, Conn(port), "POST", "/v1/completions", body)
            assert r.status == 200, (r.status, r.body)
            out[k] = full_choices(r, 1 if k[0] == "g" else 2)
        except Exception as e:  # noqa: BLE001
            errs.append(f"{k}: {type(e).__name__}: {e}")

    t0 = time.time()
    if at_once:
        th = [threading.Thread(target=one, args=(k,), daemon=True) for k in keys]
        for t in th:
            t.start()
        for t in th:
            t.join(timeout=max(1.0, 60 - (time.time() - t0)))
        assert not any(t.is_alive() for t in th), "requests still running after 60 s"
    else:
        for k in keys:
            one(k)
    dt = time.time() - t0
    assert not errs, errs
    tokens = 0
    for k in keys:
        texts, fin, _, u = out[k]
        tokens += u["completion_tokens"]
        assert texts == ref[k][0] and fin == ref[k][1], \
            f"{k} {'at once' if at_once else 'one at a time'}: {texts} {fin} != the reference {ref[k][0]} {ref[k][1]}"
    return tokens, dt, ctx.stats.get("503 retries", 0) - retries0


def client(ctx, port, idx, deadline, ref, plan):
    """One load thread: its planned requests, each checked; stops at its own deadline."""
    conn = Conn(port, keep=(idx % 2 == 0))
    rng = random.Random(1000 + idx)
    bads = bad_requests()
    for kind, arg in plan:
        if time.time() > deadline:
            ctx.fail(f"client {idx}: its time limit passed before '{kind}'")
            break
        what = f"client {idx} {kind} {arg}"
        try:
            if kind == "bad":
                name, method, path, body, status, param = bads[arg]
                r = conn.request(method, path, body)
                error_of(r, status, param)
                ctx.count("bad: " + name)
                continue
            stream = kind.endswith("stream")
            if kind.startswith("greedy"):
                n = 2 if kind.startswith("greedy_n2") else 1
                body = greedy_body(arg, n=n, stream=stream, **({} if stream else {"logprobs": 2}))
                key = ("g", arg)
            elif kind.startswith("seeded"):
                n = 2
                body = sampled_body(arg, stream=stream, **({} if stream else {"logprobs": 0}))
                key = ("s", arg)
            elif kind.startswith("unseeded"):
                n = 1 + rng.randrange(2)
                body = {"prompt": GREEDY[arg][0], "max_tokens": 4 + rng.randrange(12), "n": n, "stream": stream,
                        "temperature": round(0.5 + rng.random(), 2), "top_p": 0.95}
                key = None
            elif kind == "abandon":
                body = greedy_body(arg, stream=True, max_tokens=40)
                r = send_good(ctx, conn, "POST", "/v1/completions", body, stream=True, abandon=True)
                assert r.status == 200 and r.events, (r.status, r.body)
                ctx.count("good: stream dropped after its first chunk")
                continue
            else:
                raise AssertionError(kind)
            r = send_good(ctx, conn, "POST", "/v1/completions", body, stream=stream)
            assert r.status == 200, f"status {r.status}: {r.body[:300]!r}"
            if stream:
                texts, fin = sse_choices(r, n)
                lps = [None] * n
            else:
                texts, fin, lps, _ = full_choices(r, n)
            if key is not None:
                want_t, want_f, want_lp = ref[key]
                if key[0] == "g":  # greedy: every choice is the single reference
                    want_t, want_f, want_lp = want_t * n, want_f * n, want_lp * n
                assert texts == want_t and fin == want_f, f"{texts} {fin} != the reference {want_t} {want_f}"
                for c in range(n):
                    check_logprobs(ctx, lps[c], want_lp[c], what)
            ctx.count(f"good: {kind} n={n}")
        except Exception as e:  # noqa: BLE001
            ctx.fail(f"{what}: {type(e).__name__}: {e}")
    conn.close()


def load(ctx, port, ref):
    """Step 3: --clients threads of --rounds requests each, two in three good."""
    a = ctx.a
    goods = [("greedy", len(GREEDY)), ("greedy_stream", len(GREEDY)), ("greedy_n2", len(GREEDY)),
             ("seeded", len(SAMPLED)), ("seeded_stream", len(SAMPLED)), ("unseeded", len(GREEDY)),
             ("unseeded_stream", len(GREEDY)), ("abandon", len(GREEDY))]
    nbad = len(bad_requests())
    plans, g, b = [], 0, 0
    for idx in range(a.clients):
        plan = []
        for k in range(a.rounds):
            if k % 3 == 2:
                plan.append(("bad", b % nbad))
                b += 1
            else:
                kind, m = goods[g % len(goods)]
                plan.append((kind, (g // len(goods)) % m))
                g += 1
        random.Random(idx).shuffle(plan)
        plans.append(plan)
    t0 = time.time()
    deadline = t0 + a.client_seconds
    th = [threading.Thread(target=client, args=(ctx, port, i, deadline, ref, plans[i]), daemon=True)
          for i in range(a.clients)]
    for t in th:
        t.start()
    for t in th:
        t.join(timeout=max(0.1, deadline + 35 - time.time()))  # + a request's socket timeout
    dt = time.time() - t0
    alive = sum(t.is_alive() for t in th)
    assert alive == 0, f"{alive} client threads still running {dt:.0f} s after the start"
    ngood = sum(v for k, v in ctx.stats.items() if k.startswith("good:"))
    nbadc = sum(v for k, v in ctx.stats.items() if k.startswith("bad:"))
    print(f"load: {a.clients} clients x {a.rounds} requests in {dt:.1f} s: {ngood} good and {nbadc} bad ones "
          f"answered as expected, {ctx.stats.get('503 retries', 0)} retries after a 503 (at most "
          f"{ctx.stats.get('most tries', 1)} tries for one request, {a.max_attempts} allowed), {len(ctx.failures)} "
          f"failures; log-probabilities at most {ctx.stats.get('largest log-probability difference', 0):.2e} from "
          f"one at a time (tolerance {LOGPROB_TOL:g})")
    for k in sorted(ctx.stats):
        if k.startswith(("good:", "bad:")):
            print(f"  {ctx.stats[k]:4d}  {k}")
    assert all(("bad: " + x[0]) in ctx.stats for x in bad_requests()), "a kind of bad request was not sent"


def drain(ctx, srv, ref):
    """Step 5: SIGTERM with streams running; they finish complete, the server exits 0."""
    keys = [0, 2, 4, 7]
    conns = [Conn(srv.port) for _ in keys]
    for c, i in zip(conns, keys):
        c.c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        c.c.request("POST", "/v1/completions", body=json.dumps(greedy_body(i, stream=True)).encode(),
                    headers={"Content-Type": "application/json"})
    resps = [c.c.getresponse() for c in conns]
    firsts = []
    for r in resps:
        assert r.status == 200, r.status
        firsts.append(r.readline())  # the first event: the stream is running
    t0 = time.time()
    srv.p.send_signal(signal.SIGTERM)
    for r, first, i in zip(resps, firsts, keys):
        body = first + r.read()
        events = [(0, ln[len("data: "):]) for ln in body.decode().split("\n") if ln.startswith("data: ")]
        texts, fin = sse_choices(Reply(200, {"content-type": "text/event-stream"}, b"", events), 1)
        assert texts == ref[("g", i)][0] and fin == ref[("g", i)][1], f"drained stream {i}: {texts} {fin}"
    for c in conns:
        c.close()
    try:
        rc = srv.p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("serve_gpt did not exit within 30 s of SIGTERM")
    dt = time.time() - t0
    log = srv.log()
    m = re.search(r"SIGTERM: draining (\d+) request\(s\)", log)
    assert rc == 0, f"serve_gpt exited with {rc} after SIGTERM"
    assert m and "serve_gpt: stopped" in log, log[-2000:]
    print(f"SIGTERM with {len(keys)} streams running (the server counted {m.group(1)} in flight): every stream "
          f"complete and equal to its reference, exit code 0 after {dt:.1f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--shards", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--deck", default=os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"))
    ap.add_argument("--clients", type=int, default=36)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-queue", type=int, default=8)
    ap.add_argument("--max-attempts", type=int, default=40, help="tries of a good request answered 503")
    ap.add_argument("--client-seconds", type=float, default=60, help="each client thread's time limit")
    ap.add_argument("--rss-margin-mib", type=float, default=200)
    ap.add_argument("--server-threads", default="1",
                    help="the server's OMP_NUM_THREADS ('' keeps the environment's): the clients take the test's "
                         "other core, and two OpenMP threads sharing the cores with them stall for up to "
                         "~0.2 s per token")
    a = ap.parse_args()
    if not os.path.exists("/proc/self/status"):
        print("skipped: no /proc/PID/status here to read the server's RSS from")
        return 77
    apps = os.path.join(a.build, "apps")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t_start = time.time()
    ck = os.path.join(a.work, "ck")
    # the initial weights (one step at lr 0): greedy answers differ between prompts and along a sequence
    run([os.path.join(apps, "pretrain_gpt"), "--deck", a.deck, "--data.train_shards", a.shards, "--train.iters", "1",
         "--optim.lr", "0", "--optim.min_lr", "0", "--eval.interval", "0", "--checkpoint.save", ck])
    vocab = os.path.join(os.path.dirname(a.shards), "gpt2")
    srv = Server(os.path.join(apps, "serve_gpt"),
                 ["--checkpoint", ck, "--vocab-file", os.path.join(vocab, "encoder.json"), "--merge-file",
                  os.path.join(vocab, "vocab.bpe"), "--port", "0", "--max-batch", str(MAX_BATCH), "--max-queue",
                  str(a.max_queue), "--max-body-bytes", str(MAX_BODY)],
                 os.path.join(a.work, "serve.log"),
                 env=dict(os.environ, OMP_NUM_THREADS=a.server_threads) if a.server_threads else None)
    ctx = Ctx(a)
    ok = False
    try:
        conn = Conn(srv.port)
        r = conn.request("GET", "/health")
        assert r.status == 200 and r.json() == {"status": "ok"}, (r.status, r.body)
        rss0, hwm0 = srv.status_kib("VmRSS"), srv.status_kib("VmHWM")
        print(f"serve_gpt on port {srv.port} (--max-batch {MAX_BATCH} --max-queue {a.max_queue} --max-body-bytes "
              f"{MAX_BODY}): RSS after start-up {rss0 / 1024:.1f} MiB (VmHWM {hwm0 / 1024:.1f} MiB)")
        ref = references(ctx, srv.port)
        tok1, dt1, _ = timed(ctx, srv.port, ref, at_once=False)
        tokb, dtb, retb = timed(ctx, srv.port, ref, at_once=True)
        print(f"the same {len(GREEDY) + len(SAMPLED)} requests without log-probabilities, each answer its reference: "
              f"one at a time {tok1} tokens in {dt1:.2f} s = {tok1 / dt1:.0f} tokens/s; all at once {tokb} tokens in "
              f"{dtb:.2f} s = {tokb / dtb:.0f} tokens/s ({retb} retries after a 503); batched / one at a time "
              f"{(tokb / dtb) / (tok1 / dt1):.2f} (printed, not asserted)")
        load(ctx, srv.port, ref)
        assert not ctx.failures, "\n".join(ctx.failures[:30])
        # afterwards: alive, and one at a time still the reference, bit for bit
        r = conn.request("GET", "/health")
        assert r.status == 200 and r.json() == {"status": "ok"}, (r.status, r.body)
        for i in (0, 6):
            r = conn.request("POST", "/v1/completions", greedy_body(i, logprobs=2))
            assert r.status == 200, (r.status, r.body)
            texts, fin, lps, _ = full_choices(r, 1)
            assert (texts, fin, lps) == ref[("g", i)], f"after the load, greedy {i}: {texts} {lps} != {ref[('g', i)]}"
        hwm = srv.status_kib("VmHWM")
        bound = rss0 + a.rss_margin_mib * 1024
        print(f"after the load: /health ok, greedy one at a time bit for bit the reference; peak RSS (VmHWM) "
              f"{hwm / 1024:.1f} MiB, bound {bound / 1024:.1f} MiB (start-up RSS + {a.rss_margin_mib:.0f} MiB)")
        assert hwm < bound, f"peak RSS {hwm / 1024:.1f} MiB over {bound / 1024:.1f} MiB"
        drain(ctx, srv, ref)
        ok = True
    finally:
        srv.kill()
        if not ok:
            print("--- serve_gpt's log (tail) ---\n" + srv.log()[-3000:])
    print(f"serve_load: passed in {time.time() - t_start:.1f} s")
    shutil.rmtree(a.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
