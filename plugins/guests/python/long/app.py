"""py-long: a cooperative long task.

Sleeps `ms` milliseconds (param, default 1000) in steps of `step_ms`
(default 50) with the host's cancellable sleep, reporting progress after each
step, and ends `canceled` as soon as the host asks it to stop.

With `--param mode=spin` it instead spins in Python code and ignores
cancellation, to show that the host still stops it: by force once the grace
period or the timeout runs out.

With `--param mode=nondet` it does what differs between two runs, for the
flight recorder: it logs the wall and monotonic clocks and random bytes, then
sleeps `steps` (default 3) random lengths of 1 to 8 ms, stopping when asked,
and answers what it saw; with `--param fail=1` it then fails. With
`--param dir=/data` (a granted directory) it first lists it and reads each
file in it; with `--param trap=1` it traps (`os.abort`) when a random byte
is even; with `--param kv=1` it counts its runs in its slot's key-value
bucket and keeps what it saw last there; with `--param url=URL` it sends a
GET to URL (granted with --allow-http) through wasi:http and answers the
status and body too (built against the `task-plugin-http` world).
"""

import os
import time
from urllib.parse import urlsplit

import taskhost
from componentize_py_types import Err, Ok
from wit_world.imports import atomics, outgoing_handler, store, streams
from wit_world.imports import wasi_http_types as http


def http_get(url: str) -> tuple[int, bytes]:
    """GETs `url` through wasi:http/outgoing-handler: the status and body."""
    parts = urlsplit(url)
    request = http.OutgoingRequest(http.Fields.from_list([]))
    request.set_scheme(http.Scheme_Https() if parts.scheme == "https" else http.Scheme_Http())
    request.set_authority(parts.netloc)
    request.set_path_with_query((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    future = outgoing_handler.handle(request, None)
    with future.subscribe() as ready:
        ready.block()
    answer = future.get()
    if not isinstance(answer, Ok) or not isinstance(answer.value, Ok):
        raise taskhost.Fail(f"GET {url}: {answer}")
    response = answer.value.value
    status = response.status()
    chunks = []
    with response.consume() as body:
        with body.stream() as stream:
            while True:
                try:
                    chunks.append(stream.blocking_read(65536))
                except Err as e:
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise
    return status, b"".join(chunks)


def read_dir(path: str) -> str:
    seen = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                seen.append(f"{name}={f.read().decode(errors='replace').strip()}")
        else:
            seen.append(f"{name}/")
    return " ".join(seen)


def nondet() -> str:
    seen = f"wall {time.time():.6f} mono {time.monotonic():.6f} random {os.urandom(8).hex()}"
    taskhost.log.info(seen)
    path = taskhost.param("dir")
    if path:
        listed = read_dir(path)
        taskhost.log.info(f"{path}: {listed}")
        seen += f" {path}: {listed}"
    if taskhost.param("kv"):
        bucket = store.open("")
        runs = atomics.increment(bucket, "runs", 1)
        last = bucket.get("last")
        bucket.set("last", seen.encode())
        seen += f" run {runs}, last {len(last or b'')} bytes"
    url = taskhost.param("url")
    if url:
        status, body = http_get(url)
        taskhost.log.info(f"{url}: {status}, {len(body)} bytes")
        seen += f" {url}: {status} {body[:40].decode(errors='replace').strip()}"
    if taskhost.param("trap") and os.urandom(1)[0] % 2 == 0:
        taskhost.log.info("trapping: a random byte was even")
        os.abort()
    for step in range(taskhost.param_int("steps", 3)):
        if taskhost.cancelled() or not taskhost.sleep(os.urandom(1)[0] % 8 + 1):
            taskhost.log.info(f"stopped at step {step}, {time.time():.6f}")
            raise taskhost.Canceled()
    seen += f" end {time.monotonic():.6f}"
    if taskhost.param("fail"):
        raise taskhost.Fail(f"failed on purpose after {seen}")
    return seen


class WitWorld:
    def describe(self):
        return taskhost.info(
            "py-long",
            "0.1.0",
            description="Sleeps ms (default 1000) in steps of step_ms (default 50); cancellable (Python)",
        )

    @taskhost.task
    def run(self, input: bytes) -> bytes:
        total = taskhost.param_int("ms", 1000)
        step = taskhost.param_int("step_ms", 50)
        if total < 0 or step <= 0:
            raise taskhost.Fatal("ms must be >= 0 and step_ms > 0", 2)
        if taskhost.param("mode") == "nondet":
            return nondet()
        if taskhost.param("mode") == "spin":
            taskhost.log.info("spinning; only a force-abort stops this")
            while True:
                pass
        done = 0
        taskhost.progress(0, total)
        while done < total:
            if taskhost.cancelled():
                raise taskhost.Canceled()
            this = min(step, total - done)
            if not taskhost.sleep(this):
                taskhost.log.info(f"cancelled after {done} ms")
                raise taskhost.Canceled()
            done += this
            taskhost.progress(done, total)
        return f"slept {done} ms"
