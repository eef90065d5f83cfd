//! `deploy`: an example of a plugin that acts on a resource. Its resource
//! template `deploy/{env}` makes two deploys to the same environment take
//! turns, and its default policy `replace` makes a newer deploy stop an older
//! one.
//!
//! Params: `env` (required, fills the resource template), `ms` (default 50):
//! how long the pretend deployment takes.

use taskhost_guest::{Context, PluginInfo, Policy, Task, TaskError};

struct Deploy;

impl Task for Deploy {
    fn describe() -> PluginInfo {
        PluginInfo::new("deploy", "1.0.0")
            .description("Deploys to the environment named by the env param (a pretend deployment)")
            .resource("deploy/{env}")
            .default_policy(Policy::Replace)
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let env = ctx.param_required("env")?;
        let ms: u64 = ctx.param_parse_or("ms", 50)?;
        taskhost_guest::info!(ctx, "deploying to {env} (attempt {})", ctx.attempt());
        if ctx.sleep_ms(ms).is_cancelled() {
            taskhost_guest::warn!(ctx, "deploy to {env} cancelled");
            return Err(TaskError::canceled());
        }
        Ok(format!("deployed to {env}").into_bytes())
    }
}

taskhost_guest::export_task!(Deploy);
