//! `fanout`: a parent that spawns `n` children of its own plugin, waits for
//! each and answers `{"sum":S,"children":[ids],"failed":F}`, where each
//! child `i` answers `i*i` after sleeping `ms` (cancellably).
//!
//! Params: `n` (default 3); `ms` (default 0): each child's sleep; `i` (set
//! on children): makes this instance the child `i`.

use std::time::Duration;

use taskhost_guest::{Context, PluginInfo, SleepStatus, Task, TaskError, children};

struct Fanout;

impl Task for Fanout {
    fn describe() -> PluginInfo {
        PluginInfo::new("fanout", "0.1.0")
            .description("Spawns children of itself and sums their outputs")
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let ms: u64 = ctx.param_parse_or("ms", 0)?;
        if let Some(i) = ctx.param("i") {
            let i: u64 = i
                .parse()
                .map_err(|e: std::num::ParseIntError| taskhost_guest::fatal(e.to_string()))?;
            if ms > 0 && ctx.sleep(Duration::from_millis(ms)) == SleepStatus::Cancelled {
                return Err(TaskError::canceled());
            }
            return Ok((i * i).to_string().into_bytes());
        }
        let n: u64 = ctx.param_parse_or("n", 3)?;
        let mut ids = Vec::new();
        for i in 0..n {
            let spec = children::Spec::new()
                .param("i", i.to_string())
                .param("ms", ms.to_string());
            ids.push(children::spawn(&spec)?);
        }
        taskhost_guest::info!(ctx, "spawned {n} children");
        let (mut sum, mut failed) = (0u64, 0u64);
        for id in &ids {
            let outcome = children::wait(*id)?;
            match outcome.status {
                children::Status::Completed => {
                    sum += String::from_utf8_lossy(&outcome.output)
                        .parse::<u64>()
                        .map_err(|e| taskhost_guest::fatal(e.to_string()))?;
                }
                _ => failed += 1,
            }
        }
        let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
        Ok(format!(
            "{{\"sum\":{sum},\"children\":[{}],\"failed\":{failed}}}",
            ids.join(",")
        )
        .into_bytes())
    }
}

taskhost_guest::export_task!(Fanout);
