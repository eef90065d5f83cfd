//! Owns `GET /api/openapi.json`: an OpenAPI 3.1 document of the JSON API,
//! built from [`ROUTES`], the table `mod.rs` guards its routes by (each
//! route's scope comes from here, so the document cannot say another scope
//! than the one enforced). Tests check the other direction: every route in
//! it answers, with the scope it names, and the submit body's documented
//! properties are exactly the ones `POST /api/tasks` takes.

use serde_json::{Map, Value, json};

use crate::server::scope::Scope;

/// One route of the API.
pub(super) struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub scope: Scope,
    pub summary: &'static str,
}

const fn route(
    method: &'static str,
    path: &'static str,
    scope: Scope,
    summary: &'static str,
) -> Route {
    Route {
        method,
        path,
        scope,
        summary,
    }
}

/// Every route of the JSON API (the dashboard page `/` aside).
pub(super) const ROUTES: &[Route] = &[
    route("get", "/metrics", Scope::Read, "Prometheus metrics"),
    route("get", "/api/openapi.json", Scope::Read, "This document"),
    route(
        "get",
        "/api/tasks",
        Scope::Read,
        "The rows of `host ps --json` (`?all=true`: with finished ones; `state`, `slot`, `name`, `plugin`, `outcome`, `limit`, `before`: a page of those that match, newest first)",
    ),
    route(
        "get",
        "/api/tasks/{task}",
        Scope::Read,
        "A task's page: its row, outcome, attempts and log",
    ),
    route(
        "get",
        "/api/tasks/{task}/logs",
        Scope::Read,
        "Its log lines (`?follow=true`: server-sent events until it ends)",
    ),
    route(
        "get",
        "/api/slots",
        Scope::Read,
        "The rows of `host slots --json`",
    ),
    route(
        "get",
        "/api/namespaces",
        Scope::Read,
        "The namespaces the token reaches, as `host ns ls --json` (its quotas and use)",
    ),
    route(
        "put",
        "/api/namespaces/{name}",
        Scope::Admin,
        "Adds or changes a namespace, as `host ns add|set --json` (a token of every namespace)",
    ),
    route(
        "delete",
        "/api/namespaces/{name}",
        Scope::Admin,
        "Removes an empty namespace, as `host ns rm --json` (a token of every namespace)",
    ),
    route(
        "get",
        "/api/slot-rules",
        Scope::Read,
        "The rows of `host slot ls --json`",
    ),
    route(
        "put",
        "/api/slot-rules",
        Scope::Admin,
        "Set a slot rule, as `host slot set --json`: {pattern, capacity, max_queue}",
    ),
    route(
        "delete",
        "/api/slot-rules",
        Scope::Admin,
        "Remove a slot rule (`?pattern=P`), as `host slot unset --json`",
    ),
    route(
        "get",
        "/api/events",
        Scope::Read,
        "Server-sent events, as `host events --follow --json` (`?task=ID|NAME`)",
    ),
    route(
        "get",
        "/api/plugins",
        Scope::Read,
        "The rows of `host plugins ls --json`",
    ),
    route(
        "get",
        "/api/version",
        Scope::Read,
        "The daemon's build and protocol versions",
    ),
    route(
        "get",
        "/api/wire",
        Scope::Read,
        "Upgrade to the daemon's own protocol (`Upgrade: taskhost-wire`), as `host --remote` does",
    ),
    route(
        "put",
        "/api/plugins/{digest}",
        Scope::Submit,
        "Store a plugin by its SHA-256 (the body: its bytes); a no-op when present",
    ),
    route(
        "post",
        "/api/tasks",
        Scope::Submit,
        "Submit a task (an `Idempotency-Key` header makes it idempotent)",
    ),
    route(
        "post",
        "/api/tasks/batch",
        Scope::Submit,
        "Submit up to 1,000 tasks (`{\"tasks\": [...]}`, each a POST /api/tasks body): one answer per task, in order",
    ),
    route(
        "post",
        "/api/tasks/cancel",
        Scope::Admin,
        "Stop every live task that matches (`{\"state\", \"slot\", \"name\", \"plugin\", \"dry_run\"}`), as `host cancel --filter --json`",
    ),
    route(
        "post",
        "/api/tasks/rerun",
        Scope::Submit,
        "Submit again every finished task that matches (`{\"outcome\", \"slot\", \"name\", \"plugin\", \"dry_run\"}`), as `host rerun --filter --json`",
    ),
    route(
        "get",
        "/api/tasks/{task}/outcome",
        Scope::Submit,
        "Its result as `host wait --json`; `?wait=DUR` long-polls (202 without one yet)",
    ),
    route(
        "post",
        "/api/tasks/{task}/rerun",
        Scope::Submit,
        "Submit a new task with this task's request",
    ),
    route(
        "post",
        "/api/tasks/{task}/cancel",
        Scope::Admin,
        "Stop it and answer once it has ended, as `host cancel --json`",
    ),
    route(
        "post",
        "/api/tasks/{task}/remove",
        Scope::Admin,
        "Ask it to stop and answer at once, as `host remove --json`",
    ),
    route(
        "delete",
        "/api/plugins/{digest}",
        Scope::Admin,
        "Remove a stored plugin no unfinished task uses",
    ),
    route(
        "post",
        "/api/shutdown",
        Scope::Admin,
        "Shut the daemon down, as `host shutdown --json`",
    ),
    route(
        "get",
        "/api/schedules",
        Scope::Read,
        "The rows of `host schedule ls --json`",
    ),
    route(
        "post",
        "/api/schedules",
        Scope::Submit,
        "Add a schedule: name, cron, tz, missed, and `task` (the body of POST /api/tasks)",
    ),
    route(
        "delete",
        "/api/schedules/{schedule}",
        Scope::Admin,
        "Delete a schedule, as `host schedule rm --json`",
    ),
    route(
        "post",
        "/api/schedules/{schedule}/pause",
        Scope::Admin,
        "Pause a schedule, as `host schedule pause --json`",
    ),
    route(
        "post",
        "/api/schedules/{schedule}/resume",
        Scope::Admin,
        "Resume a schedule, as `host schedule resume --json`",
    ),
    route(
        "post",
        "/api/schedules/{schedule}/run",
        Scope::Submit,
        "Fire a schedule once now; answered as POST /api/tasks",
    ),
];

/// The scope a route needs, by method and path as [`ROUTES`] writes them.
pub(super) fn scope(method: &str, path: &str) -> Scope {
    ROUTES
        .iter()
        .find(|r| r.method == method && r.path == path)
        .map_or(Scope::Admin, |r| r.scope)
}

/// The properties of `POST /api/tasks`'s body, with their JSON types.
pub(super) const SUBMIT_PROPERTIES: &[(&str, &str, &str)] = &[
    (
        "plugin",
        "string",
        "the plugin's SHA-256 (hex, optionally `sha256:`); upload it first",
    ),
    ("name", "string", "the task's name"),
    (
        "slot",
        "string",
        "its slot (default: the plugin's resource, else the name)",
    ),
    ("policy", "string", "queue, replace or drop-if-running"),
    ("params", "object", "template and guest parameters, strings"),
    ("input", "string", "the input as text"),
    ("input_base64", "string", "the input as base64"),
    ("restart", "string", "never, on-failure or always"),
    (
        "every",
        "string",
        "rerun this long after a success (a duration)",
    ),
    (
        "max_retries",
        "integer",
        "give up after this many retries (implies restart on-failure; not with never)",
    ),
    ("backoff", "string", "FIRST,MAX,FACTOR,JITTER"),
    ("timeout", "string", "per attempt (a duration)"),
    ("max_memory", "string", "bytes, or a size like 64MiB"),
    (
        "dirs",
        "array",
        "HOST::GUEST[:ro] grants, on the daemon's machine",
    ),
    ("env", "object", "environment variables for the guest"),
    (
        "secrets",
        "object",
        "environment variable -> the daemon's secret it gets, by name",
    ),
    (
        "config",
        "object",
        "what wasi:config/store answers the guest",
    ),
    ("kv", "array", "shared key-value buckets the guest may open"),
    (
        "allow_http",
        "array",
        "[http://]HOST[:PORT] the guest may call",
    ),
    ("idempotency_key", "string", "as the Idempotency-Key header"),
    (
        "delay",
        "string",
        "hold it this long after it is accepted (a duration)",
    ),
    ("at", "string", "hold it until this time (RFC 3339)"),
    (
        "priority",
        "integer",
        "its attempts' priority for permits (higher first)",
    ),
];

/// The schema of one submission's JSON (`POST /api/tasks`).
fn submit_schema() -> Value {
    let properties: Map<String, Value> = SUBMIT_PROPERTIES
        .iter()
        .map(|(name, kind, what)| {
            (
                (*name).to_owned(),
                json!({ "type": kind, "description": what }),
            )
        })
        .collect();
    json!({
        "type": "object",
        "required": ["plugin"],
        "additionalProperties": false,
        "properties": properties,
    })
}

/// The document.
pub(super) fn document() -> Value {
    let mut paths = Map::new();
    for r in ROUTES {
        let mut operation = json!({
            "summary": r.summary,
            "x-taskhost-scope": r.scope.name(),
            "security": [{ "bearer": [] }],
            "responses": {
                "200": { "description": "as the CLI's --json" },
                "401": { "description": "no token, or one the daemon does not hold" },
                "403": { "description": format!("a token whose scope is below {}", r.scope.name()) },
            },
        });
        let parameters: Vec<Value> = ["task", "digest", "schedule"]
            .iter()
            .filter(|p| r.path.contains(&format!("{{{p}}}")))
            .map(|p| json!({ "name": p, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect();
        if !parameters.is_empty() {
            operation["parameters"] = Value::Array(parameters);
        }
        if r.method == "post" && r.path == "/api/tasks/batch" {
            operation["requestBody"] = json!({
                "required": true,
                "content": { "application/json": { "schema": {
                    "type": "object",
                    "required": ["tasks"],
                    "additionalProperties": false,
                    "properties": { "tasks": {
                        "type": "array",
                        "maxItems": crate::wire::protocol::MAX_BATCH,
                        "items": submit_schema(),
                    } },
                } } },
            });
        }
        if r.method == "post" && r.path == "/api/tasks" {
            operation["requestBody"] = json!({
                "required": true,
                "content": { "application/json": { "schema": submit_schema() } },
            });
            operation["responses"]["201"] =
                json!({ "description": "accepted: as `host submit --json`" });
            operation["responses"]["409"] =
                json!({ "description": "the idempotency key was given with another request" });
        }
        let entry = paths
            .entry(r.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[r.method] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "taskhost daemon",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Every verb of the daemon's socket, over HTTP. Errors are {\"error\": message} with the CLI's wording.",
        },
        "components": { "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } } },
        "paths": paths,
    })
}
