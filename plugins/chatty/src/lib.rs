//! `chatty`: writes numbered lines to stdout and stderr, for testing output
//! capture.
//!
//! Params: `lines` (default 3).

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct Chatty;

impl Task for Chatty {
    fn describe() -> PluginInfo {
        PluginInfo::new("chatty", "0.1.0").description(
            "Writes a number of lines (param lines, default 3) to stdout and to stderr",
        )
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let lines: u64 = ctx.param_parse_or("lines", 3)?;
        for i in 1..=lines {
            println!("stdout line {i}");
            eprintln!("stderr line {i}");
        }
        Ok(b"chatty done".to_vec())
    }
}

taskhost_guest::export_task!(Chatty);
