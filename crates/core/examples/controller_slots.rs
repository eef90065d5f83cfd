//! A controller in front of a supervisor: tasks keyed by slot, one owner
//! per slot. A second deploy of the same service queues behind the first,
//! a newer config push replaces the running one, and a duplicate health
//! check is rejected while one is running.
//!
//! Run with `cargo run -p taskhost --example controller_slots`.

use std::time::Duration;

use taskhost_core::prelude::*;

fn work(label: &'static str, ms: u64) -> impl TaskBody {
    native(move |ctx| async move {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok(label.as_bytes().to_vec()),
            _ = ctx.cancellation().cancelled() => Err(TaskError::Canceled),
        }
    })
}

#[tokio::main]
async fn main() {
    let controller = Controller::builder(Supervisor::default())
        .max_slot_queue(10)
        .build();

    let submit = |name: &str, slot: &str, policy: AdmissionPolicy, body| {
        let spec = TaskSpec::once(name, body).with_slot(slot);
        controller.submit(Submission::new(spec).policy(policy))
    };

    let deploy_1 = submit(
        "deploy-1",
        "deploy/api",
        AdmissionPolicy::Queue,
        work("v1", 200),
    );
    let deploy_2 = submit(
        "deploy-2",
        "deploy/api",
        AdmissionPolicy::Queue,
        work("v2", 50),
    );
    let push_1 = submit(
        "push-1",
        "config",
        AdmissionPolicy::Replace,
        work("c1", 5_000),
    );
    let push_2 = submit("push-2", "config", AdmissionPolicy::Replace, work("c2", 50));
    let check_1 = submit(
        "check-1",
        "health",
        AdmissionPolicy::DropIfRunning,
        work("ok", 100),
    );
    let check_2 = submit(
        "check-2",
        "health",
        AdmissionPolicy::DropIfRunning,
        work("ok", 100),
    );

    for slot in controller.snapshot() {
        println!(
            "slot {:<10} {:<11} owner {:?}, {} queued",
            slot.key,
            slot.state.as_str(),
            slot.owner.map(|id| id.get()),
            slot.queue_depth
        );
    }
    for waiter in [deploy_1, deploy_2, push_1, push_2, check_1, check_2] {
        let report = waiter.report().await;
        match &report.outcome {
            TaskOutcome::Completed { output } => {
                println!(
                    "{:>9}: completed: {}",
                    report.name,
                    String::from_utf8_lossy(output)
                );
            }
            other => println!("{:>9}: {:?}", report.name, other),
        }
    }
    controller.shutdown(Duration::from_secs(1)).await;
}
