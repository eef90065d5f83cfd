//! `fanout`: a parent that spawns `n` children of its own plugin, waits for
//! each and answers `{"sum":S,"children":[ids],"failed":F}`, where each
//! child `i` answers `i*i` after sleeping `ms` (cancellably).
//!
//! Params: `n` (default 3); `ms` (default 0): each child's sleep; `slot`:
//! each child's slot (default: its own); `child`: children of that plugin
//! (a digest or a deployment) instead, each given `i` as its input (so
//! `hello` children sum to `0+1+…`); `i` (set on children): makes this
//! instance the child `i`. `bench` (default 0):
//! instead, spawn this many children one after another, each answering the
//! wall-clock time it started, and answer the spawn call's and the
//! spawn-to-start time's p50 and p99 in µs
//! (`{"spawn_p50_us":…,"spawn_p99_us":…,"start_p50_us":…,"start_p99_us":…}`).
//! `depth` (default 0): instead, a tree: this task spawns `n` children of
//! depth `depth - 1` (each doing the same, sleeping `ms` first) and waits
//! for them; a spawn the host refuses is logged and counted, not failed.
//! It answers `{"tasks":T,"refused":R,"failed":F}` for its whole subtree
//! (T counts the tasks that completed, itself included).

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
        let depth: u64 = ctx.param_parse_or("depth", 0)?;
        if depth > 0 {
            let n: u64 = ctx.param_parse_or("n", 2)?;
            return tree(ctx, depth, n, ms).map(String::into_bytes);
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
            let mut spec = children::Spec::new()
                .param("i", i.to_string())
                .param("ms", ms.to_string());
            // `child`: children of that plugin (a digest or a deployment),
            // each given `i` as its input.
            if let Some(child) = ctx.param("child") {
                spec = spec.plugin(child).input(i.to_string());
            }
            // `slot`: every child in that slot, one after another.
            if let Some(slot) = ctx.param("slot") {
                spec = spec.slot(slot);
            }
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

/// One task of a tree (`depth` > 0): spawns `n` children one level less
/// deep, waits for them, and sums their subtrees' counts.
fn tree(ctx: &Context, depth: u64, n: u64, ms: u64) -> Result<String, TaskError> {
    if ms > 0 && ctx.sleep(Duration::from_millis(ms)) == SleepStatus::Cancelled {
        return Err(TaskError::canceled());
    }
    let (mut tasks, mut refused, mut failed) = (1u64, 0u64, 0u64);
    let mut ids = Vec::new();
    for _ in 0..n {
        let mut spec = children::Spec::new().param("n", n.to_string());
        if depth > 1 {
            spec = spec.param("depth", (depth - 1).to_string());
        } else {
            spec = spec.param("i", "1");
        }
        match children::spawn(&spec.param("ms", ms.to_string())) {
            Ok(id) => ids.push(id),
            Err(e) => {
                taskhost_guest::warn!(ctx, "spawn refused: {e}");
                refused += 1;
            }
        }
    }
    for id in ids {
        let outcome = children::wait(id)?;
        match outcome.status {
            children::Status::Completed => {
                let text = String::from_utf8_lossy(&outcome.output);
                tasks += field(&text, "tasks").unwrap_or(1);
                refused += field(&text, "refused").unwrap_or(0);
                failed += field(&text, "failed").unwrap_or(0);
            }
            children::Status::Canceled | children::Status::ForceAborted => {
                return Err(TaskError::canceled());
            }
            _ => failed += 1,
        }
    }
    Ok(format!(
        "{{\"tasks\":{tasks},\"refused\":{refused},\"failed\":{failed}}}"
    ))
}

/// The number after `"name":` in a child's answer.
fn field(text: &str, name: &str) -> Option<u64> {
    let at = text.find(&format!("\"{name}\":"))? + name.len() + 3;
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
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
