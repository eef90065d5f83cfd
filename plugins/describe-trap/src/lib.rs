//! `describe-trap`: a bad plugin whose `describe()` panics (a trap). The host
//! must refuse it at load time with a message naming describe.

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct DescribeTrap;

impl Task for DescribeTrap {
    fn describe() -> PluginInfo {
        panic!("describe-trap: describe panics on purpose")
    }

    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        Ok(input)
    }
}

taskhost_guest::export_task!(DescribeTrap);
