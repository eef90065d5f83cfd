//! Helpers for tests that talk to a daemon through the library's
//! [`Client`] (many requests in flight on one connection, replies routed by
//! request id). Include it with `#[path = "common/wire.rs"] mod wire;` next
//! to `mod common;`.

#![allow(dead_code)]

use std::path::Path;

use taskhost::daemon::Client;
use taskhost::daemon::protocol::{EventFilter, Reply, Request};
use taskhost::runtime::Digest;
use taskhost::supervisor::Event;

/// Connects and shakes hands; panics if the daemon does not answer.
pub async fn connect(socket: &Path) -> Client {
    Client::connect(socket)
        .await
        .expect("connect to the daemon")
}

/// Sends a request and returns its first reply (an error reply included).
pub async fn call(client: &Client, body: Request) -> Reply {
    client
        .request(body)
        .await
        .expect("send a request")
        .next()
        .await
        .expect("the daemon closed the connection before replying")
}

/// Uploads a plugin file from `plugins/`.
pub async fn upload_plugin(client: &Client, name: &str) -> Digest {
    let bytes = std::fs::read(plugin_artifacts::path(name)).expect("read the plugin");
    client
        .ensure_plugin(&bytes)
        .await
        .expect("the plugin uploads")
}

/// `K=V` params from pairs.
pub fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Follows a daemon's events (its recorded history first) until the daemon
/// dies; fails on dropped events, which would blind an invariant checker.
pub async fn follow_events(socket: &Path) -> tokio::task::JoinHandle<Vec<Event>> {
    let client = connect(socket).await;
    let mut replies = client
        .request(Request::Events {
            follow: true,
            filter: EventFilter::default(),
        })
        .await
        .expect("follow events");
    tokio::spawn(async move {
        let _client = client;
        let mut events = Vec::new();
        while let Ok(reply) = replies.next_reply().await {
            match reply {
                Reply::Event(event) => events.push(event),
                Reply::Dropped(n) => panic!("the event follower lost {n} events"),
                _ => {}
            }
        }
        events
    })
}
