//! A supervisor of native (async closure) tasks: one that fails twice and
//! is retried with backoff, one that times out, one cancelled while it
//! runs; then a graceful shutdown. Prints each task's report and the event
//! stream as JSON lines.
//!
//! Run with `cargo run -p taskhost --example native_supervisor`.

use std::time::Duration;

use taskhost_core::prelude::*;
use taskhost_core::supervisor::Received;

#[tokio::main]
async fn main() {
    let supervisor = Supervisor::builder()
        .max_concurrent(4)
        .grace(Duration::from_secs(2))
        .build();

    // Every lifecycle event, as one JSON line each.
    let mut events = supervisor.subscribe();
    let printer = tokio::spawn(async move {
        while let Some(received) = events.recv().await {
            if let Received::Event(event) = received {
                println!("event {}", event.to_json());
            }
        }
    });

    let flaky = native(|ctx| async move {
        if ctx.attempt() < 3 {
            Err(TaskError::fail(format!("attempt {} failed", ctx.attempt())))
        } else {
            Ok(b"third time lucky".to_vec())
        }
    });
    let flaky = supervisor.add(
        TaskSpec::restartable("flaky", flaky)
            .with_backoff(BackoffPolicy::constant(Duration::from_millis(20))),
    );

    let slow = native(|_ctx| async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(Vec::new())
    });
    let slow =
        supervisor.add(TaskSpec::once("slow", slow).with_timeout(Duration::from_millis(100)));

    let patient = native(|ctx| async move {
        // A cooperative body: it ends as soon as it is asked to.
        ctx.cancellation().cancelled().await;
        Err(TaskError::Canceled)
    });
    let patient = supervisor.add(TaskSpec::once("patient", patient));
    let id = patient.id();

    for waiter in [flaky, slow] {
        let report = waiter.report().await;
        println!(
            "report {}: {} after {} attempt(s)",
            report.name,
            report.outcome.kind(),
            report.attempts
        );
    }
    supervisor.cancel(id).await;
    let report = patient.report().await;
    println!("report {}: {}", report.name, report.outcome.kind());

    let shutdown = supervisor.shutdown(Duration::from_secs(2)).await;
    println!("shutdown: {shutdown:?}");
    let _ = printer.await;
}
