use std::fmt::Write as _;

use taskhost_guest::{Context, PluginInfo, SleepStatus, Task, TaskError, kv};

struct Nondet;

fn wall_ms() -> u64 {
    let now = wasip2::clocks::wall_clock::now();
    now.seconds * 1000 + u64::from(now.nanoseconds / 1_000_000)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl Task for Nondet {
    fn describe() -> PluginInfo {
        PluginInfo::new("nondet", "0.1.0")
            .description("Reads clocks, random bytes, key-value state and cancellation")
    }

    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let wall = wall_ms();
        if EXTRA_CLOCK {
            let _ = wall_ms();
        }
        let mono = wasip2::clocks::monotonic_clock::now();
        let random = wasip2::random::random::get_random_bytes(16);
        let seed = wasip2::random::insecure_seed::insecure_seed();
        let fast = wasip2::random::insecure::get_insecure_random_u64();
        taskhost_guest::info!(ctx, "wall {wall} ms, random {}", hex(&random));
        let mut out = format!(
            "{{\"input\":{:?},\"wall_ms\":{wall},\"mono_ns\":{mono},\"random\":\"{}\",\
             \"seed\":\"{:x}{:x}\",\"fast\":{fast}",
            String::from_utf8_lossy(&input),
            hex(&random),
            seed.0,
            seed.1
        );
        if ctx.param("kv").is_some() {
            let state = kv::Bucket::slot()?;
            let runs = state.increment("runs", 1)?;
            let last = state.get_string("last")?.unwrap_or_default();
            state.set("last", hex(&random[..4]).as_bytes())?;
            let _ = write!(out, ",\"runs\":{runs},\"last\":{last:?}");
        }
        if let Some(plugin) = ctx.param("child") {
            let spec = taskhost_guest::children::Spec::new()
                .key("child")
                .plugin(plugin)
                .input(hex(&random[..2]));
            let id = taskhost_guest::children::spawn(&spec)?;
            let outcome = taskhost_guest::children::wait(id)?;
            let _ = write!(out, ",\"child\":{:?}", outcome.reason);
            let output = outcome.completed()?;
            let _ = write!(out, ",\"child_output\":{:?}", String::from_utf8_lossy(&output));
        }
        // A trap that depends on the random bytes.
        if ctx.param("trap").is_some() && random[0] % 2 == 0 {
            panic!("random byte {} is even", random[0]);
        }
        // Works in steps until asked to stop: the stop comes at a moment
        // the record keeps.
        if ctx.param("until_cancelled").is_some() {
            let mut steps = 0u64;
            loop {
                if ctx.is_cancelled() {
                    taskhost_guest::info!(ctx, "stopped after {steps} steps at {} ms", wall_ms());
                    return Err(TaskError::canceled());
                }
                steps += 1;
                let ms = u64::from(wasip2::random::random::get_random_bytes(1)[0] % 8) + 1;
                if ctx.sleep_ms(ms) == SleepStatus::Cancelled {
                    taskhost_guest::info!(ctx, "sleep {steps} cut short at {} ms", wall_ms());
                    return Err(TaskError::canceled());
                }
            }
        }
        // Spins after a few clock reads, to be stopped by force.
        if ctx.param("spin").is_some() {
            taskhost_guest::info!(ctx, "spinning from {} ms", wall_ms());
            let mut x = 0u64;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        out.push('}');
        if ctx.param("fail").is_some() {
            return Err(taskhost_guest::fail(format!("failed on purpose after {out}")));
        }
        Ok(out.into_bytes())
    }
}

taskhost_guest::export_task!(Nondet);
