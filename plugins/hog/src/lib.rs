//! `hog`: takes what the host counts per attempt, one more at a time and
//! keeping everything, until the host refuses, to test its per-attempt caps.
//!
//! Params: `what`: `files` (default; opens `path`, default `/data/hog.txt`,
//! again and again, keeping every descriptor) or `handles` (makes timer
//! pollables, keeping every one); `count` (default 100000): stop after that
//! many. With `release=PATH` (files only), once an open fails it logs
//! `holding N open files` and keeps them until PATH exists (checked every
//! 10 ms, without opening anything), so a test can look at the host while
//! they are held.
//!
//! Output: `opened N files` or `made N handles` when all `count` worked.
//! A refused open fails the attempt: `open #N of PATH failed: ERROR`. A
//! handle past the host's cap is the host's to refuse (it traps the guest).

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct Hog;

impl Task for Hog {
    fn describe() -> PluginInfo {
        PluginInfo::new("hog", "0.1.0")
            .description("Opens files or makes WASI handles until the host refuses one")
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let count: usize = ctx.param_parse_or("count", 100_000)?;
        match ctx.param_or("what", "files") {
            "files" => files(ctx, count),
            "handles" => {
                let mut held = Vec::new();
                for _ in 0..count {
                    // A timer an hour away: one handle, no descriptor.
                    held.push(wasip2::clocks::monotonic_clock::subscribe_duration(
                        3_600_000_000_000,
                    ));
                }
                Ok(format!("made {} handles", held.len()).into_bytes())
            }
            other => Err(taskhost_guest::fatal(format!(
                "what={other}: use what=files or what=handles"
            ))),
        }
    }
}

fn files(ctx: &Context, count: usize) -> Result<Vec<u8>, TaskError> {
    let path = ctx.param_or("path", "/data/hog.txt");
    let mut held = Vec::new();
    for n in 1..=count {
        match std::fs::File::open(path) {
            Ok(file) => held.push(file),
            Err(err) => {
                if let Some(release) = ctx.param("release") {
                    taskhost_guest::info!(ctx, "holding {} open files", held.len());
                    while std::fs::metadata(release).is_err() {
                        if ctx.sleep_ms(10).is_cancelled() {
                            return Err(TaskError::canceled());
                        }
                    }
                }
                return Err(taskhost_guest::fail(format!(
                    "open #{n} of {path} failed: {err}"
                )));
            }
        }
    }
    Ok(format!("opened {} files", held.len()).into_bytes())
}

taskhost_guest::export_task!(Hog);
