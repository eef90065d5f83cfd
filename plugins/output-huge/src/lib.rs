//! `output-huge`: `run` returns `mib` MiB of output (default 17), more than the
//! host's limit of 16 MiB, so the attempt must fail with a reason naming the
//! limit.
//!
//! Params: `mib` (default 17).

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct OutputHuge;

impl Task for OutputHuge {
    fn describe() -> PluginInfo {
        PluginInfo::new("output-huge", "0.1.0")
            .description("Returns mib MiB of output (param, default 17): over the host's limit")
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let mib: usize = ctx.param_parse_or("mib", 17)?;
        Ok(vec![b'x'; mib << 20])
    }
}

taskhost_guest::export_task!(OutputHuge);
