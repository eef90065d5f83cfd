//! Helpers for tests that talk to a daemon through the library's
//! [`Client`] (many requests in flight on one connection, replies routed by
//! request id). Include it with `#[path = "common/wire.rs"] mod wire;` next
//! to `mod common;`.

#![allow(dead_code)]

use std::path::Path;

use taskhost::daemon::Client;
use taskhost::daemon::protocol::{Reply, Request};
use taskhost::runtime::Digest;

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
