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
//! (cancellably), so a test can see which attempt wrote when.

use taskhost_guest::{Context, PluginInfo, SleepStatus, Task, TaskError, kv};

struct Counter;

impl Task for Counter {
    fn describe() -> PluginInfo {
        PluginInfo::new("counter", "0.1.0")
            .description("Counts its runs in its slot's key-value bucket")
    }

    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let state = kv::Bucket::slot()?;
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

taskhost_guest::export_task!(Counter);
