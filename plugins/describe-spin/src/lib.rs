//! `describe-spin`: a bad plugin whose `describe()` busy-loops forever without
//! calling the host. The host must give up after its describe time limit.

use std::hint::black_box;

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct DescribeSpin;

impl Task for DescribeSpin {
    fn describe() -> PluginInfo {
        let mut counter: u64 = 0;
        loop {
            counter = black_box(counter.wrapping_add(1));
        }
    }

    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        Ok(input)
    }
}

taskhost_guest::export_task!(DescribeSpin);
