//! Runtime benchmark: instantiate + run of the `hello` plugin in process,
//! pooling allocator side by side with the on-demand allocator (the
//! baseline), and plugin load time in a fresh process with a warm and a
//! cold compilation cache.
//!
//! Run with `cargo bench -p taskhost --bench runtime`. Prints medians (and
//! p10/p90) of several rounds, because this machine is shared and noisy.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use taskhost::runtime::{
    AllocatorChoice, AttemptFacts, AttemptRequest, NullSink, Runtime, RuntimeConfig, Sandbox,
    StopSignals,
};

const TASKS_PER_ROUND: usize = 2_000;
const ROUNDS: usize = 15;
const CHILD_LOADS: usize = 15;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child-load") {
        child_load(Path::new(&args[i + 1]), args.get(i + 2).map(PathBuf::from));
        return;
    }
    let hello = PathBuf::from(plugin_artifacts::HELLO);
    println!(
        "# runtime benchmark ({} rounds of {TASKS_PER_ROUND} tasks)",
        ROUNDS
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let pooling = rt.block_on(instantiate_and_run(&hello, AllocatorChoice::Pooling));
    let on_demand = rt.block_on(instantiate_and_run(&hello, AllocatorChoice::OnDemand));
    report("instantiate+run hello, pooling", &pooling, "µs/task");
    report(
        "instantiate+run hello, on-demand (baseline)",
        &on_demand,
        "µs/task",
    );
    println!(
        "ratio on-demand/pooling (median): {:.2}x",
        median(&on_demand) / median(&pooling)
    );

    let cache = tempdir();
    // The first child compiles and fills the cache.
    let cold_first = child(&hello, Some(&cache));
    let warm: Vec<f64> = (0..CHILD_LOADS)
        .map(|_| child(&hello, Some(&cache)))
        .collect();
    let cold: Vec<f64> = (0..5).map(|_| child(&hello, None)).collect();
    println!("first load filling the cache: {cold_first:.0} µs");
    report("load hello in a fresh process, warm cache", &warm, "µs");
    report(
        "load hello in a fresh process, no cache (baseline)",
        &cold,
        "µs",
    );
    let _ = std::fs::remove_dir_all(&cache);
}

async fn instantiate_and_run(plugin: &Path, allocator: AllocatorChoice) -> Vec<f64> {
    let config = RuntimeConfig::default()
        .allocator(allocator)
        .cache_dir(None);
    let runtime = Runtime::new(&config).expect("runtime");
    let plugin = runtime.load_file(plugin).await.expect("load hello");
    let request = AttemptRequest {
        facts: Arc::new(AttemptFacts {
            task_id: 1,
            name: "hello-1".into(),
            slot: "hello-1".into(),
            attempt: 1,
            params: Vec::new(),
            args: Vec::new(),
        }),
        input: Arc::from(&b"hi"[..]),
        sandbox: Arc::new(Sandbox::default()),
        sink: Arc::new(NullSink),
        parking: None,
        record: None,
    };
    let signals = StopSignals::default();
    // Warm up the pool slots and caches.
    for _ in 0..200 {
        runtime
            .run_attempt(&plugin, &request, &signals)
            .await
            .expect("run");
    }
    let mut per_task = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..TASKS_PER_ROUND {
            let out = runtime
                .run_attempt(&plugin, &request, &signals)
                .await
                .expect("run");
            assert_eq!(out, b"hi");
        }
        per_task.push(start.elapsed().as_secs_f64() * 1e6 / TASKS_PER_ROUND as f64);
    }
    per_task
}

/// Runs this binary again to time one load in a fresh process.
fn child(plugin: &Path, cache: Option<&Path>) -> f64 {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.arg("--child-load").arg(plugin);
    if let Some(cache) = cache {
        cmd.arg(cache);
    }
    let out = cmd.output().expect("spawn child");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("child said {text:?} {:?}", out.stderr))
}

fn child_load(plugin: &Path, cache: Option<PathBuf>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = RuntimeConfig::default().cache_dir(cache);
    let runtime = Runtime::new(&config).expect("runtime");
    let start = Instant::now();
    rt.block_on(runtime.load_file(plugin)).expect("load");
    println!("{:.1}", start.elapsed().as_secs_f64() * 1e6);
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("taskhost-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

fn report(name: &str, v: &[f64], unit: &str) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let pick = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name}: median {:.1} {unit} (p10 {:.1}, p90 {:.1}, n={})",
        pick(0.5),
        pick(0.1),
        pick(0.9),
        s.len()
    );
}
