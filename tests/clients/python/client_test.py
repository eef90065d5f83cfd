#!/usr/bin/env python3
"""A program that drives taskhost's JSON API through a Python client that
openapi-python-client generated from the daemon's own `/api/openapi.json`,
and nothing else: every request is one of the generated functions, every
body one of the generated models, every answer read from the generated
model it was parsed into. If the document does not describe what the API
does, this program fails.

tests/e2e/openapi.rs runs it against a live daemon. By hand, with a daemon
listening on `--http` (its token in TOKEN):

    curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:PORT/api/openapi.json > openapi.json
    openapi-python-client generate --path openapi.json --meta none \\
        --output-path GEN/taskhost_api
    PYTHONPATH=GEN python3 tests/clients/python/client_test.py \\
        --url http://127.0.0.1:PORT --token "$TOKEN" \\
        --plugin target/plugins/hello.wasm --sleeper target/plugins/sleeper.wasm

What it does, each step checked: uploads both plugins (uploadPlugin, by
their SHA-256), submits a `hello` task (submitTask) and long-polls its
outcome (getOutcome), submits a batch of two good tasks and one with a bad
plugin digest (submitBatch), starts a long `sleeper`, sees its outcome is
not there yet (getOutcome's 202) and finds it in the task list (listTasks),
then cancels it (cancelTask) and reads its `canceled` outcome. It exits 0
when every answer is as expected, 1 with the mismatch otherwise.

The generated package is `taskhost_api` (the name of the folder generated
into). The generated functions are found by their operationId (in whichever
tag's folder the generator put them), and the request models by the type
of the functions' `body` parameter, so that the program depends on the
document's operationIds, not on the names of its schemas.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import pkgutil
import re
import sys
import types
import typing

import httpx

PACKAGE = "taskhost_api"

# How many long polls of 30 s each before an outcome counts as never coming.
POLLS = 10


class Mismatch(Exception):
    """An answer that is not what the API's contract says."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Mismatch(message)


def snake(operation_id: str) -> str:
    """The module name openapi-python-client gives an operationId."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", operation_id).lower()


def operation(operation_id: str) -> types.ModuleType:
    """The generated module of `operation_id`, in any tag's folder."""
    api = importlib.import_module(f"{PACKAGE}.api")
    name = snake(operation_id)
    found = []
    for tag in pkgutil.iter_modules(api.__path__):
        if not tag.ispkg:
            continue
        try:
            found.append(importlib.import_module(f"{PACKAGE}.api.{tag.name}.{name}"))
        except ModuleNotFoundError:
            continue
    expect(
        len(found) == 1,
        f"the generated client has {len(found)} modules for operation {operation_id} "
        f"(api/*/{name}.py): the generator skipped it, or the operationId changed",
    )
    return found[0]


def body_model(module: types.ModuleType) -> type:
    """The generated model of the `body` parameter of an operation."""
    hints = typing.get_type_hints(module.sync_detailed)
    expect("body" in hints, f"{module.__name__}.sync_detailed takes no body")
    body = hints["body"]
    models = [t for t in (typing.get_args(body) or (body,)) if hasattr(t, "from_dict")]
    expect(
        len(models) == 1,
        f"the body of {module.__name__} is {body}, not one generated model: "
        "the document gives its request body no object schema",
    )
    return models[0]


def status(response: typing.Any) -> int:
    return int(response.status_code)


def shown(response: typing.Any) -> str:
    return f"{status(response)} {response.content[:500]!r}"


class Client:
    """The generated client and the operations this program calls."""

    def __init__(self, url: str, token: str) -> None:
        client_module = importlib.import_module(f"{PACKAGE}.client")
        self.types = importlib.import_module(f"{PACKAGE}.types")
        # An undocumented status raises errors.UnexpectedStatus: a mismatch.
        # Long polls wait 30 s: the timeout is well above that.
        self.client = client_module.AuthenticatedClient(
            base_url=url,
            token=token,
            raise_on_unexpected_status=True,
            timeout=httpx.Timeout(120.0),
        )
        self.upload_plugin = operation("uploadPlugin")
        self.submit_task = operation("submitTask")
        self.submit_batch = operation("submitBatch")
        self.get_outcome = operation("getOutcome")
        self.list_tasks = operation("listTasks")
        self.cancel_task = operation("cancelTask")
        self.task_model = body_model(self.submit_task)
        self.batch_model = body_model(self.submit_batch)

    def upload(self, path: str) -> str:
        """Uploads the plugin at `path`; its digest (hex)."""
        with open(path, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        body = self.types.File(
            payload=io.BytesIO(data),
            file_name=path.rsplit("/", 1)[-1],
            mime_type="application/octet-stream",
        )
        response = self.upload_plugin.sync_detailed(digest, client=self.client, body=body)
        expect(status(response) == 200, f"uploadPlugin {path}: {shown(response)}")
        stored = response.parsed
        expect(
            str(stored.digest).endswith(digest),
            f"uploadPlugin {path}: answered digest {stored.digest!r}, uploaded {digest}",
        )
        return digest

    def submit(self, task: dict[str, typing.Any]) -> typing.Any:
        """Submits `task` (a body of submitTask); the parsed 201 answer."""
        body = self.task_model.from_dict(task)
        response = self.submit_task.sync_detailed(client=self.client, body=body)
        expect(status(response) == 201, f"submitTask {task}: {shown(response)}")
        submitted = response.parsed
        expect(
            isinstance(submitted.id, int) and submitted.name == task["name"],
            f"submitTask {task}: answered id {submitted.id!r}, name {submitted.name!r}",
        )
        return submitted

    def outcome(self, task: str, wait: str = "30s") -> typing.Any:
        """The task's result, long-polled until it has one."""
        for _ in range(POLLS):
            response = self.get_outcome.sync_detailed(task, client=self.client, wait=wait)
            if status(response) == 202:
                continue
            expect(status(response) == 200, f"getOutcome {task}: {shown(response)}")
            return response.parsed
        raise Mismatch(f"getOutcome {task}: no outcome after {POLLS} long polls of {wait}")

    def pending(self, task: str) -> typing.Any:
        """The answer of a short long poll for a task that has no outcome yet."""
        response = self.get_outcome.sync_detailed(task, client=self.client, wait="50ms")
        expect(status(response) == 202, f"getOutcome {task} (running): {shown(response)}")
        return response.parsed


def check_result(result: typing.Any, id_: int, name: str, output: str) -> None:
    """A completed task's result: its id, name, outcome and output."""
    expect(
        (result.id, result.name, result.outcome, result.output, result.output_encoding)
        == (id_, name, "completed", output, "utf8"),
        f"the outcome of {name} ({id_}): id {result.id!r}, name {result.name!r}, "
        f"outcome {result.outcome!r}, output {result.output!r} "
        f"({result.output_encoding!r}); expected completed with {output!r} (utf8)",
    )
    expect(result.slot == "client-py", f"the outcome of {name}: slot {result.slot!r}")
    expect(result.attempts == 1, f"the outcome of {name}: {result.attempts!r} attempts")


def run(args: argparse.Namespace) -> None:
    api = Client(args.url, args.token)
    hello = api.upload(args.plugin)
    sleeper = api.upload(args.sleeper)

    # One task, its outcome by long poll.
    text = "through the generated Python client"
    task = {"plugin": hello, "name": "py-echo", "slot": "client-py", "input": text}
    submitted = api.submit(task)
    check_result(api.outcome(str(submitted.id)), submitted.id, "py-echo", text)

    # A batch: two tasks, and one refused in its place.
    batch = api.batch_model.from_dict(
        {
            "tasks": [
                {"plugin": hello, "name": "py-batch-1", "slot": "client-py", "input": "one"},
                {"plugin": hello, "name": "py-batch-2", "slot": "client-py", "input": "two"},
                {"plugin": "0" * 64, "name": "py-batch-3"},
            ]
        }
    )
    response = api.submit_batch.sync_detailed(client=api.client, body=batch)
    expect(status(response) == 200, f"submitBatch: {shown(response)}")
    items = response.parsed.items
    expect(len(items) == 3, f"submitBatch: {len(items)} items for 3 tasks: {items}")
    for item, (name, output) in zip(items, [("py-batch-1", "one"), ("py-batch-2", "two")]):
        expect(
            getattr(item, "name", None) == name and isinstance(getattr(item, "id", None), int),
            f"submitBatch: the item of {name} is {item}",
        )
        check_result(api.outcome(name), item.id, name, output)
    refused = items[2]
    expect(
        getattr(refused, "kind", None) == "not_found"
        and "0" * 64 in str(getattr(refused, "error", "")),
        f"submitBatch: the item of the unknown plugin is {refused}, not a `not_found` refusal",
    )

    # A long task: no outcome yet, listed, then canceled.
    long = {
        "plugin": sleeper,
        "name": "py-sleeper",
        "slot": "client-py-long",
        "params": {"ms": "600000"},
    }
    sleeping = api.submit(long)
    waiting = api.pending("py-sleeper")
    expect(
        waiting.id == sleeping.id and waiting.outcome is None,
        f"getOutcome of the running sleeper: {waiting}",
    )
    response = api.list_tasks.sync_detailed(client=api.client, limit=10)
    expect(status(response) == 200, f"listTasks: {shown(response)}")
    rows = response.parsed
    expect(len(rows) <= 10, f"listTasks?limit=10 gave {len(rows)} rows")
    mine = [r for r in rows if r.id == sleeping.id]
    expect(
        len(mine) == 1 and mine[0].name == "py-sleeper" and mine[0].slot == "client-py-long",
        f"listTasks: the sleeper ({sleeping.id}) is not listed once as itself: {rows}",
    )
    response = api.cancel_task.sync_detailed("py-sleeper", client=api.client)
    expect(status(response) == 200, f"cancelTask: {shown(response)}")
    expect(response.parsed.claimed is True, f"cancelTask: {response.parsed}")
    ended = api.outcome("py-sleeper")
    expect(
        ended.id == sleeping.id and ended.outcome == "canceled",
        f"the outcome of the canceled sleeper: {ended}",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the daemon's http://ADDR")
    parser.add_argument("--token", required=True, help="a token of submit scope or more")
    parser.add_argument("--plugin", required=True, help="the hello plugin (returns its input)")
    parser.add_argument("--sleeper", required=True, help="the sleeper plugin")
    args = parser.parse_args()
    try:
        run(args)
    except Mismatch as e:
        print(f"client_test.py: MISMATCH: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # the generated client's own errors, a missing field
        print(f"client_test.py: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        raise
    print("client_test.py: every call answered as the document says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
