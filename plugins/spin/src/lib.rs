//! `spin`: a busy loop that never calls the host and never returns. Only the
//! host's forced abort (epoch interruption) can stop it.

use std::hint::black_box;

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct Spin;

impl Task for Spin {
    fn describe() -> PluginInfo {
        PluginInfo::new("spin", "0.1.0").description(
            "Busy-loops forever without calling the host; only a forced abort stops it",
        )
    }

    fn run(_ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let mut counter: u64 = 0;
        loop {
            counter = black_box(counter.wrapping_add(1));
        }
    }
}

taskhost_guest::export_task!(Spin);
