//! `hello`: returns its input unchanged and logs how many bytes it got.

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct Hello;

impl Task for Hello {
    fn describe() -> PluginInfo {
        PluginInfo::new("hello", "0.1.0").description("Returns its input unchanged")
    }

    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        taskhost_guest::info!(ctx, "hello: got {} bytes", input.len());
        Ok(input)
    }
}

taskhost_guest::export_task!(Hello);
