//! `counter`: keeps state in its slot's key-value bucket. Each run adds one
//! to `runs`, reads the input the last run stored under `last` and stores
//! its own, and answers `{"runs":N,"previous":"<last input>"}` (and
//! `"hits":N` with `shared`).
//!
//! Params: `shared` (default none): also add one to `hits` in this shared
//! bucket (granted with `--kv NAME`); `pad` (default 0): also store a value
//! of this many bytes under `pad`, to reach a limit; `fail` (default none):
//! fail after the writes, with this reason, to show that a failed attempt's
//! writes stay; `ticks` (default 0): then add one to `attempt-N` (N: this
//! attempt's number) this many times, `tick_ms` (default 50) apart
//! (cancellably), so a test can see which attempt wrote when; `bench` (default
//! 0): instead of all that, set and get a 64-byte value this many times,
//! timing each call, and answer `{"set_p50_us":…,"set_p99_us":…,
//! "get_p50_us":…,"get_p99_us":…}`.

use taskhost_guest::{Context, PluginInfo, SleepStatus, Task, TaskError, kv};

struct Counter;

impl Task for Counter {
    fn describe() -> PluginInfo {
        PluginInfo::new("counter", "0.1.0")
            .description("Counts its runs in its slot's key-value bucket")
    }

    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let state = kv::Bucket::slot()?;
        let bench: usize = ctx.param_parse_or("bench", 0)?;
        if bench > 0 {
            return Ok(timed(&state, bench)?.into_bytes());
        }
        let runs = state.increment("runs", 1)?;
        let previous = state.get_string("last")?.unwrap_or_default();
        state.set("last", &input)?;
        let pad: usize = ctx.param_parse_or("pad", 0)?;
        if pad > 0 {
            state.set("pad", vec![b'x'; pad])?;
        }
        let hits = match ctx.param("shared") {
            Some(name) => Some(kv::Bucket::shared(name)?.increment("hits", 1)?),
            None => None,
        };
        let ticks: u64 = ctx.param_parse_or("ticks", 0)?;
        let tick_ms: u64 = ctx.param_parse_or("tick_ms", 50)?;
        let mine = format!("attempt-{}", ctx.attempt());
        for _ in 0..ticks {
            state.increment(&mine, 1)?;
            if ctx.sleep(std::time::Duration::from_millis(tick_ms)) == SleepStatus::Cancelled {
                return Err(TaskError::canceled());
            }
        }
        if let Some(reason) = ctx.param("fail") {
            return Err(taskhost_guest::fail(reason));
        }
        let mut json = format!("{{\"runs\":{runs},\"previous\":{previous:?}");
        if let Some(hits) = hits {
            json.push_str(&format!(",\"hits\":{hits}"));
        }
        json.push('}');
        Ok(json.into_bytes())
    }
}

/// `n` sets and gets of a 64-byte value (16 keys in turn), each timed.
fn timed(state: &kv::Bucket, n: usize) -> Result<String, TaskError> {
    let value = [b'v'; 64];
    let (mut sets, mut gets) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let key = format!("bench-{}", i % 16);
        let start = std::time::Instant::now();
        state.set(&key, value)?;
        let set = start.elapsed();
        let got = state.get(&key)?;
        sets.push(set.as_secs_f64() * 1e6);
        gets.push((start.elapsed() - set).as_secs_f64() * 1e6);
        if got.as_deref() != Some(&value[..]) {
            return Err(taskhost_guest::fatal("read back another value"));
        }
    }
    let q = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    Ok(format!(
        "{{\"set_p50_us\":{:.1},\"set_p99_us\":{:.1},\"get_p50_us\":{:.1},\"get_p99_us\":{:.1}}}",
        q(&mut sets, 0.5),
        q(&mut sets, 0.99),
        q(&mut gets, 0.5),
        q(&mut gets, 0.99)
    ))
}

taskhost_guest::export_task!(Counter);
