//! `deploy`: an example of a plugin that acts on a resource and calls an
//! HTTP endpoint. Its resource template `deploy/{env}` makes two deploys to
//! the same environment take turns, and its default policy `replace` makes a
//! newer deploy stop an older one.
//!
//! Params: `env` (required, fills the resource template); `endpoint`: the
//! URL the deployment is POSTed to as JSON (`{"env", "task", "attempt",
//! "version"}`, `version` being the input as text), grant its host with
//! `--allow-http`; a non-2xx answer fails the attempt (retryable), a denied
//! host is fatal. Without `endpoint` it is a dry run that sends nothing. `ms`
//! (default 50): how long it waits, cancellably, before deploying (a stand-in
//! for the build step).
//!
//! It does not declare `network`, since a dry run needs none; the host
//! denies the POST of a submission that does not grant the endpoint's host,
//! and logs the `--allow-http` flag to add.

use serde::Serialize;
use taskhost_guest::{Context, PluginInfo, Policy, Task, TaskError, http};

struct Deploy;

/// What is POSTed to the endpoint.
#[derive(Serialize)]
struct Payload<'a> {
    env: &'a str,
    task: &'a str,
    attempt: u32,
    version: String,
}

impl Task for Deploy {
    fn describe() -> PluginInfo {
        PluginInfo::new("deploy", "2.0.0")
            .description(
                "Deploys to the environment named by the env param: POSTs JSON to the endpoint \
                 param (grant it with --allow-http); a dry run without it",
            )
            .resource("deploy/{env}")
            .default_policy(Policy::Replace)
    }

    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let env = ctx.param_required("env")?;
        let ms: u64 = ctx.param_parse_or("ms", 50)?;
        taskhost_guest::info!(ctx, "deploying to {env} (attempt {})", ctx.attempt());
        if ctx.sleep_ms(ms).is_cancelled() {
            taskhost_guest::warn!(ctx, "deploy to {env} cancelled");
            return Err(TaskError::canceled());
        }
        let Some(endpoint) = ctx.param("endpoint") else {
            taskhost_guest::info!(ctx, "no endpoint param: dry run, nothing sent");
            return Ok(format!("deployed to {env} (dry run: no endpoint)").into_bytes());
        };
        let payload = Payload {
            env,
            task: ctx.name(),
            attempt: ctx.attempt(),
            version: String::from_utf8_lossy(&input).into_owned(),
        };
        let response = http::post_json(endpoint, &payload)?.error_for_status()?;
        taskhost_guest::info!(ctx, "{endpoint} answered HTTP {}", response.status());
        Ok(format!("deployed to {env}").into_bytes())
    }
}

taskhost_guest::export_task!(Deploy);
