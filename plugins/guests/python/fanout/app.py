"""py-fanout: child tasks from Python.

Starts `n` children (param, default 3) of its own plugin through
`taskhost:plugin/children`, waits for each and answers the sum of their
outputs as JSON: {"sum": S, "children": [ids]}. A child (param `i` set)
answers `i * i`. The keys `child-0`, `child-1`, ... make a retried parent
find the children it started instead of starting them again.
"""

import json

import taskhost
from componentize_py_types import Err
from wit_world.imports import children


class WitWorld:
    def describe(self):
        return taskhost.info(
            "py-fanout",
            "0.1.0",
            description="Starts n children of itself (default 3) and sums their outputs (Python)",
        )

    @taskhost.task
    def run(self, input: bytes) -> bytes:
        i = taskhost.param("i")
        if i is not None:
            return str(int(i) ** 2)
        n = taskhost.param_int("n", 3)
        ids = []
        for k in range(n):
            spec = children.ChildSpec(
                key=f"child-{k}",
                plugin=None,
                name=None,
                slot=None,
                params=[("i", str(k))],
                input=b"",
            )
            try:
                ids.append(children.spawn(spec))
            except Err as e:
                raise taskhost.Fatal(f"cannot start a child: {e.value}")
        total = 0
        for child in ids:
            try:
                outcome = children.wait(child)
            except Err as e:
                if e.value == children.WaitError.CANCELLED:
                    raise taskhost.Canceled()
                raise taskhost.Fatal(f"task {child} is not a child of this task")
            if outcome.status != children.ChildStatus.COMPLETED:
                raise taskhost.Fail(f"child {child} did not complete: {outcome.reason}")
            total += int(bytes(outcome.output).decode())
        return json.dumps({"sum": total, "children": ids})
