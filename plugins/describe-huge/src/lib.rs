//! `describe-huge`: a bad plugin whose `describe()` returns absurd sizes: a
//! 1 MiB name (of valid characters) and 100,000 capabilities. The host must
//! refuse it at load time, naming the limit, without trusting the sizes.

use taskhost_guest::{Capability, Context, PluginInfo, Task, TaskError};

struct DescribeHuge;

impl Task for DescribeHuge {
    fn describe() -> PluginInfo {
        PluginInfo::new("n".repeat(1 << 20), "0.1.0")
            .description("Returns a 1 MiB name and 100,000 capabilities from describe()")
            .capabilities((0..100_000).map(|i| Capability::Env(format!("VAR_{i}"))))
    }

    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        Ok(input)
    }
}

taskhost_guest::export_task!(DescribeHuge);
