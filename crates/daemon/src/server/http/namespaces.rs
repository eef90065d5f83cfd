//! Owns the HTTP API's namespaces: `GET /api/namespaces` (the ones the
//! token reaches, as `host ns ls --json`), the operator's `PUT` and
//! `DELETE /api/namespaces/{name}`, as `host ns add|set` and `rm`, and
//! the metrics with a `namespace` label.

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::Http;
use super::api::{error, failed};
use crate::backend::{Backend, Namespaced};
use crate::server::scope::Credential;
use crate::service::json;
use crate::wire::protocol::{NamespaceChange, NamespaceVerb, Quota, Request};

/// `GET /api/namespaces`: the namespaces the token reaches, as `host ns
/// ls --json`.
pub(super) async fn namespaces(
    State(http): State<Http>,
    Extension(credential): Extension<Credential>,
) -> Response {
    let verb = NamespaceVerb::List;
    match Backend::of(&http.daemon)
        .namespace(verb, &credential.reach)
        .await
    {
        Ok(Namespaced::Rows(rows)) => {
            Json(rows.iter().map(json::namespace).collect::<Vec<_>>()).into_response()
        }
        Ok(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "not a list".into()),
        Err(answer) => failed(answer),
    }
}

/// A secret's name (`taskhost_runtime::check_secret_name`).
pub(super) const SECRET_NAME: &str = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$";

/// The body of `PUT /api/namespaces/{name}`: what `host ns add|set`
/// changes; a quota by its key, `null` to make it unlimited.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NamespaceBody {
    /// Its weight in the fair share.
    weight: Option<u32>,
    /// Quotas by key; null makes one unlimited.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "enum": crate::wire::protocol::Quota::KEYS }))]
    quotas: std::collections::BTreeMap<String, Option<u64>>,
    /// Secrets its tasks may use from now on.
    #[serde(default)]
    #[schemars(inner(regex(pattern = SECRET_NAME)))]
    allow_secrets: Vec<String>,
    /// Secrets its tasks may no longer use.
    #[serde(default)]
    #[schemars(inner(regex(pattern = SECRET_NAME)))]
    deny_secrets: Vec<String>,
}

/// `PUT /api/namespaces/{name}`: adds the namespace, or changes it;
/// answers with it as `host ns add|set --json` prints it. The operator's.
pub(super) async fn put_namespace(
    State(http): State<Http>,
    Extension(credential): Extension<Credential>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let body: NamespaceBody = if body.is_empty() {
        NamespaceBody::default()
    } else {
        match super::api::read_json(&body) {
            Ok(b) => b,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("the namespace's JSON: {e}"),
                );
            }
        }
    };
    let mut quotas = Vec::new();
    for (key, limit) in body.quotas {
        match Quota::parse(&key) {
            Some(quota) => quotas.push((quota, limit)),
            None => {
                let keys: Vec<&str> = Quota::ALL.iter().map(|q| q.key()).collect();
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("quotas: `{key}` is not a quota: one of {}", keys.join(", ")),
                );
            }
        }
    }
    let change = NamespaceChange {
        weight: body.weight,
        quotas,
        allow_secrets: body.allow_secrets,
        deny_secrets: body.deny_secrets,
    };
    let backend = Backend::of(&http.daemon);
    let known = matches!(
        backend.namespace(NamespaceVerb::List, &credential.reach).await,
        Ok(Namespaced::Rows(rows)) if rows.iter().any(|r| r.name == name)
    );
    let verb = if known {
        NamespaceVerb::Set(name, change)
    } else {
        NamespaceVerb::Add(name, change)
    };
    verb_answer(&backend, verb, &credential).await
}

/// `DELETE /api/namespaces/{name}`: removes a namespace that holds no
/// unfinished task and no schedule; answers with it as it was.
pub(super) async fn delete_namespace(
    State(http): State<Http>,
    Extension(credential): Extension<Credential>,
    Path(name): Path<String>,
) -> Response {
    let backend = Backend::of(&http.daemon);
    verb_answer(&backend, NamespaceVerb::Remove(name), &credential).await
}

async fn verb_answer(
    backend: &Backend<'_>,
    verb: NamespaceVerb,
    credential: &Credential,
) -> Response {
    let verb = Request::Namespace(verb);
    if let Err(message) = verb.check() {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let Request::Namespace(verb) = verb else {
        unreachable!("made as a namespace verb above")
    };
    match backend.namespace(verb, &credential.reach).await {
        Ok(Namespaced::Row(row)) => Json(json::namespace(&row)).into_response(),
        Ok(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "not a row".into()),
        Err(answer) => failed(answer),
    }
}

/// `taskhost_namespace_tasks{namespace, state}`: each namespace's live
/// tasks, queued behind a slot's owner, waiting (for a permit, a retry or
/// their rate) and running, read now; one series per namespace the
/// operator made (the label set is bounded by them).
pub(super) fn metrics(
    enc: &mut prometheus_client::encoding::DescriptorEncoder<'_>,
    d: &crate::backend::daemon::Daemon,
    tasks: &[taskhost_core::supervisor::TaskInfo],
    slots: &[taskhost_core::controller::SlotView],
) -> super::metrics::Out {
    use prometheus_client::encoding::EncodeMetric;
    use prometheus_client::metrics::MetricType;
    use prometheus_client::metrics::gauge::ConstGauge;
    use taskhost_core::lifecycle::TaskState;

    use crate::service::namespace::Ns;
    const STATES: [&str; 3] = ["queued", "waiting", "running"];
    let mut counts: std::collections::BTreeMap<(Ns, usize), u64> = d
        .namespaces
        .all()
        .into_iter()
        .flat_map(|(ns, _)| (0..STATES.len()).map(move |i| ((ns.clone(), i), 0)))
        .collect();
    let mut add = |key: &str, state: usize, n: u64| {
        if let Some(count) = counts.get_mut(&(Ns::of(key), state)) {
            *count += n;
        }
    };
    for slot in slots {
        add(&slot.key, 0, slot.queue_depth as u64);
    }
    for task in tasks {
        let state = match task.phase {
            TaskState::Running | TaskState::Stopping => 2,
            TaskState::Waiting | TaskState::BackingOff | TaskState::Throttled => 1,
            _ => continue,
        };
        add(&task.name, state, 1);
    }
    let mut family = enc.encode_descriptor(
        "taskhost_namespace_tasks",
        "Live tasks of each namespace by state: queued (behind a slot's owner), waiting (for a run permit, a retry or a rate) and running.",
        None,
        MetricType::Gauge,
    )?;
    for ((ns, state), n) in counts {
        let labels = [("namespace", ns.name()), ("state", STATES[state])];
        let gauge = ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        gauge.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
