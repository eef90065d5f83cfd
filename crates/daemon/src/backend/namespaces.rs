//! Owns what the backend does for namespaces: `host ns` (one host's
//! namespaces kept by its store; a cluster has only the default one yet),
//! a submission's quotas, and the namespace's keys of the names a verb on
//! schedules, buckets and slot rules carries.

use crate::backend::daemon::Daemon;
use crate::backend::{Backend, Kind, Namespaced};
use crate::service::error::ServiceError;
use crate::service::namespace::{self, Namespaces, Ns, Reach, over_quota};
use crate::wire::protocol::{
    DEFAULT_NAMESPACE, KvTarget, KvVerb, NamespaceSettings, NamespaceVerb, Quota, ScheduleVerb,
    SlotRuleVerb, SubmitRequest,
};

/// Follows the namespaces a cluster's database holds: each one set as it
/// is there, those gone removed.
pub(crate) fn follow_namespaces(daemon: &Daemon, rows: Vec<(String, NamespaceSettings)>) {
    let held = daemon.namespaces.all();
    for (ns, _) in &held {
        if !ns.is_default() && !rows.iter().any(|(name, _)| Ns::named(Some(name)) == *ns) {
            set_namespace(daemon, ns.clone(), None);
        }
    }
    for (name, settings) in rows {
        let ns = Ns::named(Some(&name));
        // Unchanged ones keep their submission rate's state.
        if !held.iter().any(|(n, s)| *n == ns && *s == settings) {
            set_namespace(daemon, ns, Some(settings));
        }
    }
}

/// Sets (`Some`) or removes a namespace in the daemon's memory and its
/// supervisor's shares.
pub(crate) fn set_namespace(daemon: &Daemon, ns: Ns, settings: Option<NamespaceSettings>) {
    let supervisor = daemon.controller.supervisor();
    let weight = settings.as_ref().map_or(1, |s| s.weight);
    let group = ns.share();
    supervisor.set_share_weight(group.as_deref(), weight);
    // One host's cap of running attempts (a cluster's claims hold it).
    let running = settings
        .as_ref()
        .and_then(|s| s.limit(Quota::Running))
        .filter(|_| daemon.one_host().is_some())
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    supervisor.set_share_limit(group.as_deref(), running);
    daemon.namespaces.put(ns, settings);
}

impl Backend<'_> {
    /// A `host ns` verb. Listing shows the namespaces `reach` covers;
    /// changes are the operator's (checked by the server). One host keeps
    /// them in its store; a cluster in its database, for every node.
    pub(crate) async fn namespace(
        &self,
        verb: NamespaceVerb,
        reach: &Reach,
    ) -> Result<Namespaced, ServiceError> {
        let daemon = self.daemon();
        let namespaces = &daemon.namespaces;
        if verb != NamespaceVerb::List {
            // A cluster's other nodes may have changed them this second.
            self.refresh_namespaces().await?;
        }
        let (name, settings) = match verb {
            NamespaceVerb::List => {
                let mut rows = Vec::new();
                for (ns, settings) in namespaces.all() {
                    if reach.reaches(&ns) {
                        let usage = self.usage(&ns).await?;
                        rows.push(Namespaces::row(&ns, settings, usage));
                    }
                }
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
        let old = namespaces.all().into_iter().find(|(n, _)| *n == ns);
        if settings.is_none() {
            if ns.is_default() {
                return Err(ServiceError::Conflict(format!(
                    "the namespace `{DEFAULT_NAMESPACE}` is always there: change its quotas \
                     with `host ns set {DEFAULT_NAMESPACE}`"
                )));
            }
            let Some(_) = &old else {
                return Err(namespace::unknown(&name));
            };
            let used = self.usage(&ns).await?;
            let holds = |q: Quota| used.iter().any(|(u, n)| *u == q && *n > 0);
            if holds(Quota::Running) || holds(Quota::Waiting) || holds(Quota::Schedules) {
                return Err(ServiceError::Conflict(format!(
                    "namespace `{name}` still holds unfinished tasks or schedules: cancel them \
                     and remove its schedules first (`host --namespace {name} ps`, \
                     `host --namespace {name} schedule ls`)"
                )));
            }
        }
        let stored = match &self.kind {
            Kind::Local(local) => local
                .host
                .store
                .namespace(ns.name(), settings.clone())
                .committed()
                .await
                .map_err(|e| e.to_string()),
            Kind::Shared(shared) => shared
                .cluster
                .pg
                .set_namespace(ns.name(), settings.as_ref())
                .await
                .map_err(|e| e.to_string()),
        };
        stored.map_err(|e| {
            ServiceError::Internal(format!("the namespace could not be stored: {e}"))
        })?;
        set_namespace(daemon, ns.clone(), settings.clone());
        let shown = settings.or(old.map(|(_, s)| s)).unwrap_or_default();
        let usage = self.usage(&ns).await?;
        Ok(Namespaced::Row(Namespaces::row(&ns, shown, usage)))
    }

    /// Reads a cluster's namespaces again from its database (one host's
    /// are all in its memory).
    pub(crate) async fn refresh_namespaces(&self) -> Result<(), ServiceError> {
        if let Kind::Shared(shared) = &self.kind {
            let rows = shared
                .cluster
                .pg
                .namespaces()
                .await
                .map_err(ServiceError::Store)?;
            follow_namespaces(self.daemon(), rows);
        }
        Ok(())
    }

    /// Whether namespace `ns` exists: a cluster's other nodes may have
    /// added it this second, so one this node does not know is read again.
    pub(crate) async fn knows(&self, ns: &Ns) -> bool {
        let namespaces = &self.daemon().namespaces;
        if !namespaces.exists(ns) && self.refresh_namespaces().await.is_err() {
            return false;
        }
        namespaces.exists(ns)
    }

    /// What `ns` uses now of each counted quota.
    async fn usage(&self, ns: &Ns) -> Result<Vec<(Quota, u64)>, ServiceError> {
        let daemon = self.daemon();
        let (running, unfinished, schedules, kv) = match &self.kind {
            Kind::Local(local) => {
                let (running, unfinished) = counts(daemon, ns);
                let kv = local.host.kv.scope_bytes(&ns.share().unwrap_or_default());
                (running, unfinished, schedules_of(daemon, ns), kv)
            }
            Kind::Shared(shared) => {
                let name = (!ns.is_default()).then(|| ns.name());
                let used = shared
                    .cluster
                    .pg
                    .namespace_use(name)
                    .await
                    .map_err(ServiceError::Store)?;
                let kv = (shared.cluster.pg.namespace_kv_bytes(name).await)
                    .map_err(ServiceError::Store)?;
                (used.running, used.unfinished, used.schedules, kv)
            }
        };
        Ok(vec![
            (Quota::Running, running),
            (Quota::Waiting, unfinished.saturating_sub(running)),
            (Quota::Schedules, schedules),
            (Quota::KvBytes, kv),
        ])
    }

    /// What `ns` uses now of `quota`.
    async fn used(&self, ns: &Ns, quota: Quota) -> Result<u64, ServiceError> {
        Ok(self
            .usage(ns)
            .await?
            .into_iter()
            .find(|(q, _)| *q == quota)
            .map_or(0, |(_, n)| n))
    }

    /// Checks a submission of a namespace other than the default against
    /// its quotas, and gives it the namespace's memory ceiling. Shared
    /// buckets and secrets are the default namespace's alone in this
    /// version.
    pub(super) async fn within_quotas(
        &self,
        ns: &Ns,
        request: &mut SubmitRequest,
    ) -> Result<(), ServiceError> {
        let daemon = self.daemon();
        if !self.knows(ns).await {
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
            && self.used(ns, Quota::Waiting).await? >= limit
        {
            return Err(over_quota(
                ns,
                Quota::Waiting,
                limit,
                "tasks accepted and not running",
            ));
        }
        match (&self.kind, settings.limit(Quota::SubmitRate)) {
            // A cluster's rate is every node's submissions'.
            (Kind::Shared(shared), Some(rate)) => {
                let pg = &shared.cluster.pg;
                match pg.take_submission(ns.name(), rate).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(over_quota(
                        ns,
                        Quota::SubmitRate,
                        rate,
                        "submissions per second",
                    )),
                    Err(err) => Err(ServiceError::Store(err)),
                }
            }
            _ => daemon.namespaces.take_submission(ns),
        }
    }

    /// A schedule verb with its names as the caller's namespace keys them,
    /// within its quota of schedules.
    pub(super) async fn keyed_schedule(
        &self,
        verb: ScheduleVerb,
    ) -> Result<ScheduleVerb, ServiceError> {
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
                        let held = self.used(ns, Quota::Schedules).await?;
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

/// `ns`'s attempts running and its unfinished tasks.
fn counts(daemon: &Daemon, ns: &Ns) -> (u64, u64) {
    let supervisor = daemon.controller.supervisor();
    let running = supervisor.share_running(ns.share().as_deref()) as u64;
    (running, daemon.tasks.unfinished(ns))
}

/// `ns`'s schedules (one host's).
fn schedules_of(daemon: &Daemon, ns: &Ns) -> u64 {
    daemon
        .one_host()
        .map_or(0, |host| host.schedules.count(|name| ns.owns(name)) as u64)
}
