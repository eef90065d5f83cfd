//! `chatty`: writes numbered lines to stdout and stderr, for testing output
//! capture.
//!
//! Params: `lines` (default 3); `text`, written as one more line to stderr
//! exactly as given (control characters included); `hold_ms`, a
//! cancellable sleep after the lines (default 0), so a test can look at a
//! running task's log.

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct Chatty;

impl Task for Chatty {
    fn describe() -> PluginInfo {
        PluginInfo::new("chatty", "0.1.0").description(
            "Writes a number of lines (param lines, default 3) to stdout and to stderr, then \
             param text, if given, to stderr",
        )
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let lines: u64 = ctx.param_parse_or("lines", 3)?;
        for i in 1..=lines {
            println!("stdout line {i}");
            eprintln!("stderr line {i}");
        }
        if let Some(text) = ctx.param("text") {
            eprintln!("{text}");
        }
        let hold: u64 = ctx.param_parse_or("hold_ms", 0)?;
        if hold > 0 && ctx.sleep_ms(hold) == taskhost_guest::SleepStatus::Cancelled {
            return Err(taskhost_guest::canceled());
        }
        Ok(b"chatty done".to_vec())
    }
}

taskhost_guest::export_task!(Chatty);
