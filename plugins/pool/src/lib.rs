//! `pool`: a plugin that declares a slot capacity (WIT 0.1.2,
//! `taskhost:plugin/slots`): its resource `pool/{name}` may be owned by two
//! of its tasks at once, unless an operator's rule says otherwise. It
//! sleeps `ms` milliseconds (default 1000) in cancellable steps of 50 ms,
//! reporting progress, like `sleeper`.
//!
//! Params: `name` (required: it fills the resource), `ms`.

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct Pool;

impl Task for Pool {
    fn describe() -> PluginInfo {
        PluginInfo::new("pool", "0.1.0")
            .description("A worker of pool/{name}: two of them may run at once; sleeps ms")
            .resource("pool/{name}")
            .capacity(2)
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let total: u64 = ctx.param_parse_or("ms", 1000)?;
        ctx.progress(0, total);
        let mut elapsed = 0;
        while elapsed < total {
            let step = 50.min(total - elapsed);
            if ctx.sleep_ms(step).is_cancelled() {
                return Err(TaskError::canceled());
            }
            elapsed += step;
            ctx.progress(elapsed, total);
        }
        Ok(format!("worked {total} ms").into_bytes())
    }
}

taskhost_guest::export_task!(Pool);
