//! `sleeper`: sleeps `ms` milliseconds in cancellable steps of at most
//! `step_ms` (default 50) ms, reporting progress after each step, and stops as
//! soon as it is cancelled. It reports `0/ms` as it starts.
//!
//! Params: `ms` (default 1000), `step_ms` (default 50; a large step parks the
//! guest in one host sleep, waking only for a cancel).

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

/// The longest single host sleep by default.
const STEP_MS: u64 = 50;

struct Sleeper;

impl Task for Sleeper {
    fn describe() -> PluginInfo {
        PluginInfo::new("sleeper", "0.1.0").description(
            "Sleeps for ms milliseconds (param, default 1000) in cancellable steps, reporting progress",
        )
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let total: u64 = ctx.param_parse_or("ms", 1000)?;
        let step_ms: u64 = ctx.param_parse_or("step_ms", STEP_MS)?;
        let step_ms = step_ms.max(1);
        // 0/total: the guest is in its sleep loop (tests wait for this).
        ctx.progress(0, total);
        let mut elapsed = 0;
        while elapsed < total {
            ctx.check_cancelled()?;
            let step = step_ms.min(total - elapsed);
            if ctx.sleep_ms(step).is_cancelled() {
                return Err(TaskError::canceled());
            }
            elapsed += step;
            ctx.progress(elapsed, total);
        }
        Ok(format!("slept {total} ms").into_bytes())
    }
}

taskhost_guest::export_task!(Sleeper);
