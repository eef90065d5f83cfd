//! `fanout`: a parent that spawns `n` children of its own plugin, waits for
//! each and answers `{"sum":S,"children":[ids],"failed":F}`, where each
//! child `i` answers `i*i` after sleeping `ms` (cancellably).
//!
//! Params: `n` (default 3); `ms` (default 0): each child's sleep; `i` (set
//! on children): makes this instance the child `i`. `bench` (default 0):
//! instead, spawn this many children one after another, each answering the
//! wall-clock time it started, and answer the spawn call's and the
//! spawn-to-start time's p50 and p99 in µs
//! (`{"spawn_p50_us":…,"spawn_p99_us":…,"start_p50_us":…,"start_p99_us":…}`).

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
        if ctx.param("stamp").is_some() {
            return Ok(now_us().to_string().into_bytes());
        }
        let bench: usize = ctx.param_parse_or("bench", 0)?;
        if bench > 0 {
            return Ok(timed(bench)?.into_bytes());
        }
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

/// Microseconds since the Unix epoch.
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// `n` children one after another: how long each spawn call took, and how
/// long from the call to the child's start.
fn timed(n: usize) -> Result<String, TaskError> {
    let (mut spawns, mut starts) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let before = now_us();
        let id = children::spawn(
            &children::Spec::new()
                .key(format!("bench-{i}"))
                .param("stamp", "1"),
        )?;
        spawns.push(now_us().saturating_sub(before) as f64);
        let started: u64 = String::from_utf8_lossy(&children::wait(id)?.completed()?)
            .parse()
            .map_err(|_| taskhost_guest::fatal("a child answered no time"))?;
        starts.push(started.saturating_sub(before) as f64);
    }
    let q = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    Ok(format!(
        "{{\"spawn_p50_us\":{:.0},\"spawn_p99_us\":{:.0},\"start_p50_us\":{:.0},\"start_p99_us\":{:.0}}}",
        q(&mut spawns, 0.5),
        q(&mut spawns, 0.99),
        q(&mut starts, 0.5),
        q(&mut starts, 0.99)
    ))
}

taskhost_guest::export_task!(Fanout);
