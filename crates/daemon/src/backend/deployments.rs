//! Owns what the backend does for named deployments: `host deploy`,
//! `host deployments ls|history|rm` and `host rollback` on one host (each
//! event kept by its store before it is answered), and a submission's
//! `NAME[@VERSION|@sha256:…]` turned into its digest at intake. A cluster
//! node refuses both, saying so: its database keeps no deployments yet.

use std::sync::PoisonError;

use crate::backend::daemon::Daemon;
use crate::backend::local::OneHost;
use crate::backend::{Backend, Kind};
use crate::service::deployments::Reference;
use crate::service::error::ServiceError;
use crate::service::namespace::Ns;
use crate::wire::protocol::{DeploymentRow, DeploymentVerb, SubmitRequest};
use taskhost_runtime::ComponentKind;

/// The refusal of a deployment on a cluster node.
pub(crate) fn on_cluster() -> ServiceError {
    ServiceError::Invalid(
        "named deployments are kept by one host's store; a cluster node does not have them \
         yet: submit the plugin by its file (or digest)"
            .into(),
    )
}

/// Turns a submission's deployment into its plugin: `plugin` becomes the
/// digest of the version picked, and `deployment` `NAME@VERSION`, so that
/// the task keeps that version (resolving it again gives the same digest).
pub(crate) fn resolve(host: &OneHost, request: &mut SubmitRequest) -> Result<(), ServiceError> {
    let Some(text) = &request.deployment else {
        return Ok(());
    };
    let reference = Reference::parse(text).map_err(ServiceError::Invalid)?;
    let key = Ns::named(request.namespace.as_deref()).key(&reference.name);
    let (version, digest) = host
        .deployments
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .resolve(&key, &reference.pick)?;
    request.plugin = digest;
    request.deployment = Some(format!("{}@{version}", reference.name));
    Ok(())
}

impl Backend<'_> {
    /// A deployment verb, in the namespace the caller acts in.
    pub(crate) async fn deployment(
        &self,
        verb: DeploymentVerb,
    ) -> Result<Vec<DeploymentRow>, ServiceError> {
        let Kind::Local(local) = &self.kind else {
            return Err(on_cluster());
        };
        let host = local.host;
        let view = &self.view;
        let shown = |mut row: DeploymentRow| {
            row.name = view.show(&row.name);
            row
        };
        let memory = || {
            host.deployments
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        let _turn = host.deploying.lock().await;
        let now = crate::store::now_ms();
        let event = match verb {
            DeploymentVerb::List => {
                let rows = memory().list();
                return Ok(rows
                    .into_iter()
                    .filter(|r| view.sees(&r.name))
                    .map(shown)
                    .collect());
            }
            DeploymentVerb::History(name) => {
                let rows = memory().history(&view.key(&name))?;
                return Ok(rows.into_iter().map(shown).collect());
            }
            DeploymentVerb::Deploy {
                digest,
                name,
                version,
            } => {
                let daemon: &Daemon = self.daemon();
                let plugin = daemon.plugins.get(&digest).await.ok_or_else(|| {
                    ServiceError::NotFound(format!(
                        "the daemon does not know plugin {digest}; upload it first"
                    ))
                })?;
                let info = plugin.info();
                let name = match name {
                    Some(name) => name,
                    None if info.kind == ComponentKind::Command => {
                        return Err(ServiceError::Invalid(
                            "a WASI command declares no name: give one with --name".into(),
                        ));
                    }
                    None => info.name.clone(),
                };
                crate::wire::protocol::check_deployment_name(&name)
                    .map_err(ServiceError::Invalid)?;
                let version = match version {
                    Some(version) => version,
                    None if info.version.is_empty() => {
                        return Err(ServiceError::Invalid(format!(
                            "`{name}` declares no version: give one with --version"
                        )));
                    }
                    None => info.version.clone(),
                };
                crate::wire::protocol::check_version(&version).map_err(|e| {
                    ServiceError::Invalid(format!("its declared version: {e}; give --version"))
                })?;
                let key = view.key(&name);
                let planned = memory().deploy(&key, &version, digest, now)?;
                match planned {
                    Some(event) => event,
                    None => {
                        let rows = memory().list();
                        return Ok(rows
                            .into_iter()
                            .filter(|r| r.name == key)
                            .map(shown)
                            .collect());
                    }
                }
            }
            DeploymentVerb::Rollback { name, to } => {
                memory().rollback(&view.key(&name), to.as_deref(), now)?
            }
            DeploymentVerb::Remove { name, version } => {
                let event = memory().remove(&view.key(&name), &version, now)?;
                let shown_as = format!("{name}@{version}");
                let users: Vec<String> = self
                    .rows(false)
                    .await?
                    .into_iter()
                    .filter(|row| row.plugin == shown_as)
                    .map(|row| format!("{} (id {})", view.show(&row.name), row.id))
                    .collect();
                let schedules: Vec<String> = crate::backend::schedules::list(local.daemon, host)
                    .await
                    .into_iter()
                    .filter(|s| view.sees(&s.name) && s.plugin == shown_as)
                    .map(|s| view.show(&s.name))
                    .collect();
                if !users.is_empty() || !schedules.is_empty() {
                    let mut what = Vec::new();
                    if !users.is_empty() {
                        what.push(format!("unfinished tasks {}", users.join(", ")));
                    }
                    if !schedules.is_empty() {
                        what.push(format!("schedules {}", schedules.join(", ")));
                    }
                    return Err(ServiceError::Conflict(format!(
                        "`{shown_as}` is still used by {}: let them finish or cancel them \
                         (and remove the schedules) first",
                        what.join(" and ")
                    )));
                }
                event
            }
        };
        host.store
            .deployment(event.clone())
            .committed()
            .await
            .map_err(|e| {
                ServiceError::Internal(format!("the deployment could not be stored: {e}"))
            })?;
        memory().apply(event.clone());
        Ok(vec![shown(DeploymentRow::of(&event, 0))])
    }
}
