"""py-hello: logs the size of its input and returns the input unchanged."""

import taskhost


class WitWorld:
    def describe(self):
        return taskhost.info(
            "py-hello",
            "0.1.0",
            description="Logs the size of its input and returns it (Python)",
        )

    @taskhost.task
    def run(self, input: bytes) -> bytes:
        taskhost.log.info(f"hello: got {len(input)} bytes")
        return input
