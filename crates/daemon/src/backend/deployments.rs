//! Owns what the backend does for named deployments: `host deploy`,
//! `host deployments ls|history|rm` and `host rollback`, and a
//! submission's `NAME[@VERSION|@sha256:…]` turned into its digest at
//! intake. One host decides on its memory and keeps each event in its
//! store before it is answered; a cluster node reads the name's events
//! from the database, decides, and appends its event only after the
//! newest it read (deciding again when another node was first), so every
//! node answers the same version once a verb has returned.

use std::sync::{Arc, PoisonError};
use std::time::Instant;

use crate::backend::local::OneHost;
use crate::backend::{Backend, Kind};
use crate::cluster::node::{Cluster, DEPLOYMENTS_FRESH};
use crate::service::deployments::{Deployments, Reference};
use crate::service::error::ServiceError;
use crate::service::namespace::Ns;
use crate::service::plugins::plugin_path;
use crate::store::postgres::time::Resolve;
use crate::wire::protocol::{
    DeploymentEvent, DeploymentRow, DeploymentVerb, SubmitRequest, UPLOAD_CHUNK,
};
use taskhost_runtime::{ComponentKind, Digest};

/// Most names a cluster node keeps resolutions of; past it, the stale
/// ones go.
const CACHED_NAMES: usize = 4096;

/// How often a cluster node decides again when other nodes keep changing
/// the same deployment first.
const TRIES: usize = 8;

/// Turns a submission's deployment into its plugin with `deployments`:
/// `plugin` becomes the digest of the version picked, and `deployment`
/// `NAME@VERSION`, so that the task keeps that version (resolving it again
/// gives the same digest).
fn resolve_in(deployments: &Deployments, request: &mut SubmitRequest) -> Result<(), ServiceError> {
    let Some(text) = &request.deployment else {
        return Ok(());
    };
    let reference = Reference::parse(text).map_err(ServiceError::Invalid)?;
    let key = Ns::named(request.namespace.as_deref()).key(&reference.name);
    let (version, digest) = deployments.resolve(&key, &reference.pick)?;
    request.plugin = digest;
    request.deployment = Some(format!("{}@{version}", reference.name));
    Ok(())
}

/// [`resolve_in`] with one host's deployments.
pub(crate) fn resolve(host: &OneHost, request: &mut SubmitRequest) -> Result<(), ServiceError> {
    if request.deployment.is_none() {
        return Ok(());
    }
    let deployments = host
        .deployments
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    resolve_in(&deployments, request)
}

/// [`resolve_in`] with a cluster's deployments: the name's events read
/// from the database, at most [`DEPLOYMENTS_FRESH`] before.
pub(crate) async fn resolve_on(
    cluster: &Cluster,
    request: &mut SubmitRequest,
) -> Result<(), ServiceError> {
    let Some(text) = &request.deployment else {
        return Ok(());
    };
    let reference = Reference::parse(text).map_err(ServiceError::Invalid)?;
    let key = Ns::named(request.namespace.as_deref()).key(&reference.name);
    let fresh = {
        let cache = cluster
            .deployments
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        cache
            .get(&key)
            .filter(|(read, _)| read.elapsed() < DEPLOYMENTS_FRESH)
            .map(|(_, deployments)| Arc::clone(deployments))
    };
    let deployments = match fresh {
        Some(deployments) => deployments,
        None => {
            // Timed from before the read: a read that saw an older
            // state expires before a deploy after it answers.
            let started = Instant::now();
            let read =
                (cluster.pg.deployment_events(Some(&key)).await).map_err(ServiceError::Store)?;
            let deployments = Arc::new(Deployments::from_events(read.events));
            let mut cache = cluster
                .deployments
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if cache.len() >= CACHED_NAMES {
                cache.retain(|_, (read, _)| read.elapsed() < DEPLOYMENTS_FRESH);
            }
            cache.insert(key, (started, Arc::clone(&deployments)));
            deployments
        }
    };
    resolve_in(&deployments, request)
}

/// A cluster's schedule firings' resolution of their deployments, for the
/// store's firing transactions.
pub(crate) fn resolver(cluster: &Arc<Cluster>) -> Box<Resolve> {
    let cluster = Arc::clone(cluster);
    Box::new(move |mut request: SubmitRequest| {
        let cluster = Arc::clone(&cluster);
        Box::pin(async move {
            resolve_on(&cluster, &mut request)
                .await
                .map_err(|e| e.to_string())?;
            Ok(request)
        })
    })
}

/// What a verb decided: rows to answer at once, or an event to keep.
enum Decided {
    Rows(Vec<DeploymentRow>),
    Event(DeploymentEvent, i64),
}

impl Backend<'_> {
    /// A cluster node's resolution of a submission's deployment: the
    /// name's events read from the database.
    pub(crate) async fn resolve_shared(
        &self,
        request: &mut SubmitRequest,
    ) -> Result<(), ServiceError> {
        match &self.kind {
            Kind::Shared(shared) => resolve_on(shared.cluster, request).await,
            Kind::Local(_) => Ok(()),
        }
    }

    /// The deployments a verb decides on: one host's (a copy), or the
    /// events of `name` (every name's without one) read from a cluster's
    /// database, with the newest one's seq.
    async fn deployments_now(
        &self,
        name: Option<&str>,
    ) -> Result<(Deployments, i64), ServiceError> {
        match &self.kind {
            Kind::Local(local) => Ok((
                local
                    .host
                    .deployments
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone(),
                0,
            )),
            Kind::Shared(shared) => {
                let read = shared
                    .cluster
                    .pg
                    .deployment_events(name)
                    .await
                    .map_err(ServiceError::Store)?;
                Ok((Deployments::from_events(read.events), read.newest))
            }
        }
    }

    /// Keeps `event`, decided on the events up to `newest`: false when a
    /// cluster's other node appended one first.
    async fn keep(&self, event: &DeploymentEvent, newest: i64) -> Result<bool, ServiceError> {
        let stored = match &self.kind {
            Kind::Local(local) => {
                let committed = local.host.store.deployment(event.clone()).committed();
                committed.await.map(|()| {
                    let host = &local.host;
                    let mut deployments = host
                        .deployments
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    deployments.apply(event.clone());
                    true
                })
            }
            .map_err(|e| e.to_string()),
            Kind::Shared(shared) => {
                let appended = shared.cluster.pg.append_deployment(event, newest).await;
                if let Ok(true) = appended {
                    // Every node's resolution read before this is stale
                    // by then (see `Cluster::deployments`).
                    shared
                        .cluster
                        .deployments
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&event.name);
                    tokio::time::sleep(DEPLOYMENTS_FRESH).await;
                }
                appended.map_err(|e| e.to_string())
            }
        };
        stored
            .map_err(|e| ServiceError::Internal(format!("the deployment could not be stored: {e}")))
    }

    /// A deployment verb, in the namespace the caller acts in.
    pub(crate) async fn deployment(
        &self,
        verb: DeploymentVerb,
    ) -> Result<Vec<DeploymentRow>, ServiceError> {
        let view = &self.view;
        let shown = |mut row: DeploymentRow| {
            row.name = view.show(&row.name);
            row
        };
        // One host's verbs take turns; a cluster's decide again on a lost race.
        let _turn = match &self.kind {
            Kind::Local(local) => Some(local.host.deploying.lock().await),
            Kind::Shared(_) => None,
        };
        for _ in 0..TRIES {
            let (event, newest) = match self.decide(&verb).await? {
                Decided::Rows(rows) => return Ok(rows.into_iter().map(shown).collect()),
                Decided::Event(event, newest) => (event, newest),
            };
            if self.keep(&event, newest).await? {
                return Ok(vec![shown(DeploymentRow::of(&event, 0))]);
            }
        }
        Err(ServiceError::Unavailable(
            "other nodes kept changing this deployment meanwhile: try again".into(),
        ))
    }

    /// What `verb` comes to on the deployments of now.
    async fn decide(&self, verb: &DeploymentVerb) -> Result<Decided, ServiceError> {
        let view = &self.view;
        let now = crate::store::now_ms();
        let (key, deployments, newest) = match verb {
            DeploymentVerb::List => {
                let (deployments, _) = self.deployments_now(None).await?;
                let rows = deployments.list().into_iter();
                return Ok(Decided::Rows(rows.filter(|r| view.sees(&r.name)).collect()));
            }
            DeploymentVerb::History(name)
            | DeploymentVerb::Rollback { name, .. }
            | DeploymentVerb::Remove { name, .. } => {
                let key = view.key(name);
                let (deployments, newest) = self.deployments_now(Some(&key)).await?;
                (key, deployments, newest)
            }
            DeploymentVerb::Deploy { digest, name, .. } => {
                let name = self.deployed_name(digest, name.as_deref()).await?;
                let key = view.key(&name);
                let (deployments, newest) = self.deployments_now(Some(&key)).await?;
                (key, deployments, newest)
            }
        };
        let event = match verb {
            DeploymentVerb::List => unreachable!("answered above"),
            DeploymentVerb::History(_) => return Ok(Decided::Rows(deployments.history(&key)?)),
            DeploymentVerb::Deploy {
                digest, version, ..
            } => {
                let version = self
                    .deployed_version(digest, version.as_deref(), &key)
                    .await?;
                match deployments.deploy(&key, &version, *digest, now)? {
                    Some(event) => event,
                    None => {
                        let rows = deployments.list().into_iter();
                        return Ok(Decided::Rows(rows.filter(|r| r.name == key).collect()));
                    }
                }
            }
            DeploymentVerb::Rollback { to, .. } => {
                deployments.rollback(&key, to.as_deref(), now)?
            }
            DeploymentVerb::Remove { name, version } => {
                let event = deployments.remove(&key, version, now)?;
                self.unused(&format!("{name}@{version}")).await?;
                event
            }
        };
        Ok(Decided::Event(event, newest))
    }

    /// The name a deploy is under: the one given, else the plugin's own (a
    /// WASI command has none).
    async fn deployed_name(
        &self,
        digest: &taskhost_runtime::Digest,
        name: Option<&str>,
    ) -> Result<String, ServiceError> {
        if let Some(name) = name {
            return Ok(name.to_owned());
        }
        let plugin = self.deployed_plugin(digest).await?;
        let info = plugin.info();
        if info.kind == ComponentKind::Command {
            return Err(ServiceError::Invalid(
                "a WASI command declares no name: give one with --name".into(),
            ));
        }
        crate::wire::protocol::check_deployment_name(&info.name).map_err(ServiceError::Invalid)?;
        Ok(info.name.clone())
    }

    /// The version a deploy is: the one given, else the plugin's own.
    async fn deployed_version(
        &self,
        digest: &taskhost_runtime::Digest,
        version: Option<&str>,
        key: &str,
    ) -> Result<String, ServiceError> {
        // The plugin must be there, whatever its version.
        let plugin = self.deployed_plugin(digest).await?;
        let version = match version {
            Some(version) => version.to_owned(),
            None if plugin.info().version.is_empty() => {
                return Err(ServiceError::Invalid(format!(
                    "`{key}` declares no version: give one with --version"
                )));
            }
            None => plugin.info().version.clone(),
        };
        crate::wire::protocol::check_version(&version).map_err(|e| {
            ServiceError::Invalid(format!("its declared version: {e}; give --version"))
        })?;
        Ok(version)
    }

    /// The uploaded plugin a deploy names, loaded.
    async fn deployed_plugin(
        &self,
        digest: &taskhost_runtime::Digest,
    ) -> Result<std::sync::Arc<taskhost_runtime::Plugin>, ServiceError> {
        let daemon = self.daemon();
        let known = match &self.kind {
            Kind::Local(_) => daemon.plugins.get(digest).await,
            Kind::Shared(shared) => shared
                .cluster
                .ensure_plugin(&daemon.plugins, digest)
                .await
                .ok(),
        };
        known.ok_or_else(|| {
            ServiceError::NotFound(format!(
                "the daemon does not know plugin {digest}; upload it first"
            ))
        })
    }

    /// Refuses the removal of `shown` (`NAME@VERSION`) while an unfinished
    /// task or a schedule pinned to it uses it, naming them.
    async fn unused(&self, shown: &str) -> Result<(), ServiceError> {
        let view = &self.view;
        let users: Vec<String> = self
            .rows(false)
            .await?
            .into_iter()
            .filter(|row| row.plugin == shown)
            .map(|row| format!("{} (id {})", view.show(&row.name), row.id))
            .collect();
        let schedules: Vec<String> = match &self.kind {
            Kind::Local(local) => crate::backend::schedules::list(local.daemon, local.host)
                .await
                .into_iter()
                .filter(|s| view.sees(&s.name) && s.plugin == shown)
                .map(|s| view.show(&s.name))
                .collect(),
            Kind::Shared(shared) => (shared.cluster.pg.schedules().await)
                .map_err(ServiceError::Store)?
                .into_iter()
                .filter(|(s, _)| view.sees(&s.spec.name) && s.plugin == shown)
                .map(|(s, _)| view.show(&s.spec.name))
                .collect(),
        };
        if users.is_empty() && schedules.is_empty() {
            return Ok(());
        }
        let mut what = Vec::new();
        if !users.is_empty() {
            what.push(format!("unfinished tasks {}", users.join(", ")));
        }
        if !schedules.is_empty() {
            what.push(format!("schedules {}", schedules.join(", ")));
        }
        Err(ServiceError::Conflict(format!(
            "`{shown}` is still used by {}: let them finish or cancel them (and remove the \
             schedules) first",
            what.join(" and ")
        )))
    }
}

impl Backend<'_> {
    /// Up to [`UPLOAD_CHUNK`] bytes of a stored plugin from `offset`, with
    /// its whole length: `host push` of a deployment. A cluster node
    /// without the plugin reads it from the database.
    pub(crate) async fn plugin_chunk(
        &self,
        digest: &Digest,
        offset: u64,
    ) -> Result<(u64, Vec<u8>), ServiceError> {
        let daemon = match &self.kind {
            Kind::Local(local) => &local.daemon,
            Kind::Shared(shared) => &shared.daemon,
        };
        let path = plugin_path(&daemon.config.state_dir, digest);
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let held = match &self.kind {
                    Kind::Local(_) => None,
                    Kind::Shared(shared) => shared
                        .cluster
                        .pg
                        .plugin_bytes(digest)
                        .await
                        .map_err(ServiceError::Store)?,
                };
                held.ok_or_else(|| {
                    ServiceError::NotFound(format!(
                        "no plugin {digest} here: `host plugins` lists the stored ones"
                    ))
                })?
            }
            Err(e) => {
                return Err(ServiceError::Internal(format!(
                    "cannot read plugin {digest}: {e}"
                )));
            }
        };
        let total = bytes.len() as u64;
        let start = usize::try_from(offset.min(total)).unwrap_or(bytes.len());
        let end = bytes.len().min(start + UPLOAD_CHUNK);
        Ok((total, bytes[start..end].to_vec()))
    }
}
