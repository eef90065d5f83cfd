//! `flaky`: fails its first `fail_times` attempts (exit code 3), then succeeds.
//!
//! Params: `fail_times` (default 1).

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct Flaky;

impl Task for Flaky {
    fn describe() -> PluginInfo {
        PluginInfo::new("flaky", "0.1.0")
            .description("Fails its first fail_times attempts (param, default 1), then succeeds")
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let fail_times: u32 = ctx.param_parse_or("fail_times", 1)?;
        let attempt = ctx.attempt();
        if attempt <= fail_times {
            return Err(taskhost_guest::fail(format!(
                "flaky: attempt {attempt} of fail_times={fail_times} fails on purpose"
            ))
            .with_exit_code(3));
        }
        Ok(format!("ok after {attempt} attempts").into_bytes())
    }
}

taskhost_guest::export_task!(Flaky);
