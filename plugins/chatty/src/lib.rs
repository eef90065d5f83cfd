//! `chatty`: writes numbered lines to stdout and stderr, for testing output
//! capture, and terminal escape sequences, for testing that they reach no
//! terminal.
//!
//! Params: `lines` (default 3); `text`, written as one more line to stderr
//! exactly as given (control characters included); `escapes`, `output` or
//! `fail`: writes [`ESCAPES`] to stdout, to stderr and as a log line, then
//! (after `hold_ms`) answers `first line`, [`ESCAPES`] and `last line` on
//! three lines (no final newline), or fails with [`ESCAPES`] as its reason;
//! `hold_ms`, a cancellable sleep after the lines (default 0), so a test can
//! look at a running task's log.

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

/// What a hostile guest sends a terminal: a clipboard write (OSC 52), a new
/// window title (OSC 0), a bell, a carriage return with a forged summary,
/// a C1 control sequence introducer and a right-to-left override.
const ESCAPES: &str =
    "\x1b]52;c;aGk=\x07\x1b]0;pwned\x07\rhello-9 completed in 1 attempt \u{9b}31m\u{202e}drow";

struct Chatty;

impl Task for Chatty {
    fn describe() -> PluginInfo {
        PluginInfo::new("chatty", "0.1.0").description(
            "Writes a number of lines (param lines, default 3) to stdout and to stderr, then \
             param text, if given, to stderr; with param escapes (output or fail), terminal \
             escape sequences everywhere it can",
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
        let escapes = ctx.param("escapes");
        match escapes {
            None => {}
            Some("output" | "fail") => {
                println!("{ESCAPES}");
                eprintln!("{ESCAPES}");
                taskhost_guest::warn!(ctx, "{ESCAPES}");
            }
            Some(other) => {
                return Err(taskhost_guest::fatal(format!(
                    "chatty: escapes={other}: use escapes=output or escapes=fail"
                )));
            }
        }
        let hold: u64 = ctx.param_parse_or("hold_ms", 0)?;
        if hold > 0 && ctx.sleep_ms(hold) == taskhost_guest::SleepStatus::Cancelled {
            return Err(taskhost_guest::canceled());
        }
        match escapes {
            Some("output") => Ok(format!("first line\n{ESCAPES}\nlast line").into_bytes()),
            Some(_) => Err(taskhost_guest::fail(ESCAPES)),
            None => Ok(b"chatty done".to_vec()),
        }
    }
}

taskhost_guest::export_task!(Chatty);
