//! `oom`: allocates `chunk_mib` MiB chunks, touching every page, and keeps them
//! until an allocation fails. Rust aborts on allocation failure, which traps
//! the instance, so this never returns.
//!
//! Params: `chunk_mib` (default 1).

use std::hint::black_box;

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

/// Touch one byte per this many bytes so every host page becomes resident.
const PAGE: usize = 4096;

struct Oom;

impl Task for Oom {
    fn describe() -> PluginInfo {
        PluginInfo::new("oom", "0.1.0")
            .description("Allocates chunk_mib MiB chunks (param, default 1) until allocation fails")
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let chunk_mib: usize = ctx.param_parse_or("chunk_mib", 1)?;
        if chunk_mib == 0 {
            return Err(taskhost_guest::fatal("oom: chunk_mib must be at least 1"));
        }
        let chunk_bytes = chunk_mib
            .checked_mul(1 << 20)
            .ok_or_else(|| taskhost_guest::fatal("oom: chunk_mib is too large"))?;
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        loop {
            // A plain allocation: on failure the Rust runtime aborts (a trap).
            let mut chunk = vec![0u8; chunk_bytes];
            for i in (0..chunk_bytes).step_by(PAGE) {
                chunk[i] = black_box(i as u8) | 1;
            }
            chunks.push(black_box(chunk));
            let total_mib = chunks.len() * chunk_mib;
            if total_mib.is_multiple_of(16) {
                taskhost_guest::debug!(ctx, "oom: holding {total_mib} MiB");
            }
        }
    }
}

taskhost_guest::export_task!(Oom);
