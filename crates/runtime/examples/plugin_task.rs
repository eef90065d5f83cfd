//! Runs a WebAssembly plugin as a supervised task: loads a component, runs
//! it with an input and params, and prints its output and report. With no
//! argument it runs the `hello` plugin built with this repository.
//!
//! Run with `cargo run -p taskhost --example plugin_task [PLUGIN.wasm] [INPUT]`.

use std::path::PathBuf;
use std::sync::Arc;

use taskhost_runtime::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(plugin_artifacts::HELLO));
    let input = args
        .next()
        .unwrap_or_else(|| "hello from the example".into());

    let runtime = Arc::new(Runtime::new(&RuntimeConfig::default())?);
    let plugin = runtime.load_file(&path).await?;
    println!(
        "loaded {} {} ({})",
        plugin.info().name,
        plugin.info().version,
        plugin.digest()
    );

    let supervisor = Supervisor::default();
    let task = PluginTask::new(&runtime, &plugin).input(input.into_bytes());
    let report = supervisor
        .add(TaskSpec::once("example", task))
        .report()
        .await;
    match &report.outcome {
        TaskOutcome::Completed { output } => {
            println!("output: {}", String::from_utf8_lossy(output));
        }
        other => println!("outcome: {other:?}"),
    }
    println!("{} attempt(s) in {:?}", report.attempts, report.duration);
    supervisor.shutdown(std::time::Duration::from_secs(5)).await;
    Ok(())
}
