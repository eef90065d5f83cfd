//! `trap`: ends the attempt with a WebAssembly trap.
//!
//! Params: `kind` = `unreachable` (default; executes a wasm `unreachable`) or
//! `stack-overflow` (unbounded recursion).

use std::hint::black_box;

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

struct Trap;

impl Task for Trap {
    fn describe() -> PluginInfo {
        PluginInfo::new("trap", "0.1.0").description(
            "Traps: kind=unreachable (default) executes unreachable, kind=stack-overflow recurses forever",
        )
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        match ctx.param_or("kind", "unreachable") {
            "unreachable" => unreachable_trap(),
            "stack-overflow" => {
                let depth = recurse(black_box(0));
                // Never reached: `recurse` only returns at an impossible depth.
                Ok(format!("recursed {depth} times").into_bytes())
            }
            other => Err(taskhost_guest::fatal(format!(
                "trap: unknown kind `{other}` (expected `unreachable` or `stack-overflow`)"
            ))),
        }
    }
}

/// Executes the wasm `unreachable` instruction.
#[cfg(target_arch = "wasm32")]
fn unreachable_trap() -> ! {
    core::arch::wasm32::unreachable()
}

/// Off wasm (only for `cargo check` on the host target): abort instead.
#[cfg(not(target_arch = "wasm32"))]
fn unreachable_trap() -> ! {
    std::process::abort()
}

/// Recurses until the stack overflows. Every frame keeps a black-boxed 1 KiB
/// array alive across the recursive call, so the optimiser can neither turn
/// the recursion into a loop nor shrink the frames.
fn recurse(depth: u64) -> u64 {
    if depth == black_box(u64::MAX) {
        return depth;
    }
    let frame = black_box([depth as u8; 1024]);
    let below = recurse(black_box(depth + 1));
    below.wrapping_add(u64::from(black_box(frame)[(depth % 1024) as usize]))
}

taskhost_guest::export_task!(Trap);
