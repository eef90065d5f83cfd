//! `panic`: panics with the `message` param. The SDK's panic hook forwards the
//! message and location to the host, which makes it the failure reason.
//!
//! Params: `message` (default `plugin panicked on purpose`).

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct Panic;

impl Task for Panic {
    fn describe() -> PluginInfo {
        PluginInfo::new("panic", "0.1.0")
            .description("Panics with the message param (default: plugin panicked on purpose)")
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let message = ctx.param_or("message", "plugin panicked on purpose");
        panic!("{message}");
    }
}

taskhost_guest::export_task!(Panic);
