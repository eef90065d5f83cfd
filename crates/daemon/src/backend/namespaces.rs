//! Owns what the backend does for namespaces: `host ns` (one host's
//! namespaces kept by its store; a cluster has only the default one yet),
//! a submission's quotas, and the namespace's keys of the names a verb on
//! schedules, buckets and slot rules carries.

use std::sync::Arc;

use crate::backend::daemon::Daemon;
use crate::backend::{Backend, Kind, Namespaced};
use crate::service::error::ServiceError;
use crate::service::namespace::{self, Namespaces, Ns, Reach, over_quota};
use crate::wire::protocol::{
    DEFAULT_NAMESPACE, KvTarget, KvVerb, NamespaceSettings, NamespaceVerb, Quota, ScheduleVerb,
    SlotRuleVerb, SubmitRequest,
};

/// Sets (`Some`) or removes a namespace in the daemon's memory and its
/// supervisor's shares.
pub(crate) fn set_namespace(daemon: &Daemon, ns: Ns, settings: Option<NamespaceSettings>) {
    let supervisor = daemon.controller.supervisor();
    let weight = settings.as_ref().map_or(1, |s| s.weight);
    supervisor.set_share_weight(ns.share().as_deref(), weight);
    daemon.namespaces.put(ns, settings);
}

impl Backend<'_> {
    /// A `host ns` verb. Listing shows the namespaces `reach` covers;
    /// changes are the operator's (checked by the server).
    pub(crate) async fn namespace(
        &self,
        verb: NamespaceVerb,
        reach: &Reach,
    ) -> Result<Namespaced, ServiceError> {
        let daemon = self.daemon();
        let namespaces = &daemon.namespaces;
        let (name, settings) = match verb {
            NamespaceVerb::List => {
                let rows = namespaces
                    .all()
                    .into_iter()
                    .filter(|(ns, _)| reach.reaches(ns))
                    .map(|(ns, settings)| {
                        let usage = usage(daemon, &ns);
                        Namespaces::row(&ns, settings, usage)
                    })
                    .collect();
                return Ok(Namespaced::Rows(rows));
            }
            NamespaceVerb::Add(name, change) => {
                let ns = Ns::named(Some(&name));
                (name, Some(namespaces.changed(&ns, &change, true)?))
            }
            NamespaceVerb::Set(name, change) => {
                let ns = Ns::named(Some(&name));
                (name, Some(namespaces.changed(&ns, &change, false)?))
            }
            NamespaceVerb::Remove(name) => (name, None),
        };
        let ns = Ns::named(Some(&name));
        let Kind::Local(local) = &self.kind else {
            return Err(ServiceError::Invalid(
                "a cluster has only the default namespace in this version: namespaces are one \
                 host's (`host ns` on a daemon with its own store)"
                    .into(),
            ));
        };
        let old = namespaces.all().into_iter().find(|(n, _)| *n == ns);
        if settings.is_none() {
            if ns.is_default() {
                return Err(ServiceError::Invalid(format!(
                    "the namespace `{DEFAULT_NAMESPACE}` is always there: change its quotas \
                     with `host ns set {DEFAULT_NAMESPACE}`"
                )));
            }
            let Some(_) = &old else {
                return Err(namespace::unknown(&name));
            };
            let used = usage(daemon, &ns);
            let holds = |q: Quota| used.iter().any(|(u, n)| *u == q && *n > 0);
            if holds(Quota::Running) || holds(Quota::Waiting) || holds(Quota::Schedules) {
                return Err(ServiceError::Conflict(format!(
                    "namespace `{name}` still holds unfinished tasks or schedules: cancel them \
                     and remove its schedules first (`host --namespace {name} ps`, \
                     `host --namespace {name} schedule ls`)"
                )));
            }
        }
        local
            .host
            .store
            .namespace(ns.name(), settings.clone())
            .committed()
            .await
            .map_err(|e| {
                ServiceError::Internal(format!("the namespace could not be stored: {e}"))
            })?;
        set_namespace(daemon, ns.clone(), settings.clone());
        let shown = settings.or(old.map(|(_, s)| s)).unwrap_or_default();
        let usage = usage(daemon, &ns);
        Ok(Namespaced::Row(Namespaces::row(&ns, shown, usage)))
    }

    /// Checks a submission of a namespace other than the default against
    /// its quotas, and gives it the namespace's memory ceiling. Shared
    /// buckets and secrets are the default namespace's alone in this
    /// version.
    pub(super) fn within_quotas(
        &self,
        ns: &Ns,
        request: &mut SubmitRequest,
    ) -> Result<(), ServiceError> {
        let daemon = self.daemon();
        if !daemon.namespaces.exists(ns) {
            return Err(namespace::unknown(ns.name()));
        }
        let settings = daemon.namespaces.settings(ns);
        granted_secrets(ns, &settings, request)?;
        if let Some(key) = &request.idempotency_key {
            request.idempotency_key = Some(ns.key(key));
        }
        if let Some(ceiling) = settings.limit(Quota::Memory) {
            match request.max_memory {
                Some(asked) if asked > ceiling => {
                    return Err(over_quota(
                        ns,
                        Quota::Memory,
                        ceiling,
                        "the most memory one of its attempts may ask for",
                    ));
                }
                Some(_) => {}
                None => {
                    request.max_memory = Some(daemon.config.max_memory.min(ceiling));
                }
            }
        }
        if let Some(limit) = settings.limit(Quota::Waiting)
            && waiting(daemon, ns) >= limit
        {
            return Err(over_quota(
                ns,
                Quota::Waiting,
                limit,
                "tasks accepted and not running",
            ));
        }
        daemon.namespaces.take_submission(ns)
    }

    /// A schedule verb with its names as the caller's namespace keys them,
    /// within its quota of schedules.
    pub(super) fn keyed_schedule(&self, verb: ScheduleVerb) -> Result<ScheduleVerb, ServiceError> {
        let view = &self.view;
        Ok(match verb {
            ScheduleVerb::Add(mut spec) => {
                let ns = &view.acting;
                namespace::check_printable("schedule name", &spec.name)?;
                spec.name = view.key(&spec.name);
                spec.request.namespace = ns.as_request();
                if !ns.is_default() {
                    let settings = self.daemon().namespaces.settings(ns);
                    granted_secrets(ns, &settings, &spec.request)?;
                    if let Some(limit) = settings.limit(Quota::Schedules) {
                        let held = schedules_of(self.daemon(), ns);
                        if held >= limit {
                            return Err(over_quota(ns, Quota::Schedules, limit, "schedules"));
                        }
                    }
                }
                ScheduleVerb::Add(spec)
            }
            ScheduleVerb::List => ScheduleVerb::List,
            ScheduleVerb::Remove(name) => ScheduleVerb::Remove(view.key(&name)),
            ScheduleVerb::Pause(name) => ScheduleVerb::Pause(view.key(&name)),
            ScheduleVerb::Resume(name) => ScheduleVerb::Resume(view.key(&name)),
            ScheduleVerb::Run(name) => ScheduleVerb::Run(view.key(&name)),
        })
    }

    /// A `host kv` verb with its bucket as the caller's namespace keys it.
    pub(super) fn keyed_kv(&self, verb: KvVerb) -> KvVerb {
        let ns = &self.view.acting;
        let target = |target: KvTarget| match target {
            KvTarget::Slot(slot) => KvTarget::Slot(ns.key(&slot)),
            KvTarget::Shared(name) => KvTarget::Shared(ns.key(&name)),
        };
        match verb {
            KvVerb::List(t) => KvVerb::List(t.map(target)),
            KvVerb::Get(t, key) => KvVerb::Get(target(t), key),
            KvVerb::Remove(t, key) => KvVerb::Remove(target(t), key),
        }
    }

    /// A slot-rule verb with its pattern as the caller's namespace keys it.
    pub(super) fn keyed_slot_rule(&self, verb: SlotRuleVerb) -> SlotRuleVerb {
        let view = &self.view;
        match verb {
            SlotRuleVerb::Set(mut row) => {
                row.pattern = view.key(&row.pattern);
                SlotRuleVerb::Set(row)
            }
            SlotRuleVerb::Unset(pattern) => SlotRuleVerb::Unset(view.key(&pattern)),
            SlotRuleVerb::List => SlotRuleVerb::List,
        }
    }
}

/// Refuses a request naming a secret its namespace is not granted.
fn granted_secrets(
    ns: &Ns,
    settings: &NamespaceSettings,
    request: &SubmitRequest,
) -> Result<(), ServiceError> {
    match request
        .secrets
        .iter()
        .find(|s| !settings.secrets.contains(&s.name))
    {
        None => Ok(()),
        Some(secret) => Err(ServiceError::Invalid(format!(
            "--secret {}: namespace `{}` may not use the daemon's secret `{}`; its operator \
             can grant it with `host ns set {} --allow-secret {}`",
            secret.name,
            ns.name(),
            secret.name,
            ns.name(),
            secret.name
        ))),
    }
}

/// What `ns` uses now of each counted quota.
fn usage(daemon: &Arc<Daemon>, ns: &Ns) -> Vec<(Quota, u64)> {
    let (running, unfinished) = counts(daemon, ns);
    vec![
        (Quota::Running, running),
        (Quota::Waiting, unfinished.saturating_sub(running)),
        (Quota::Schedules, schedules_of(daemon, ns)),
    ]
}

/// Tasks of `ns` accepted and not running.
fn waiting(daemon: &Daemon, ns: &Ns) -> u64 {
    let (running, unfinished) = counts(daemon, ns);
    unfinished.saturating_sub(running)
}

/// `ns`'s attempts running and its unfinished tasks.
fn counts(daemon: &Daemon, ns: &Ns) -> (u64, u64) {
    let supervisor = daemon.controller.supervisor();
    let running = supervisor
        .list()
        .iter()
        .filter(|info| {
            ns.owns(&info.name) && info.phase == taskhost_core::lifecycle::TaskState::Running
        })
        .count() as u64;
    (running, daemon.tasks.unfinished(ns))
}

/// `ns`'s schedules (one host's).
fn schedules_of(daemon: &Daemon, ns: &Ns) -> u64 {
    daemon
        .one_host()
        .map_or(0, |host| host.schedules.count(|name| ns.owns(name)) as u64)
}
