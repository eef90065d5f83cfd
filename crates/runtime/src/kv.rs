//! Owns key-value state as guests reach it through `wasi:keyvalue` (store,
//! atomics, batch; 0.2.0-draft): which bucket a guest may open (`""` is its
//! slot's; another name only when its task was granted it), the limits on
//! keys, values and buckets, the host functions, and [`MemoryKv`], the
//! buckets in memory with an optional journal that makes each write durable
//! before the call returns. Where a daemon keeps them is its business
//! ([`KvBackend`]).

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use wasmtime::component::{HasData, Resource, ResourceTable};

use crate::bindings::keyvalue::wasi::keyvalue::{atomics, batch, store};
use crate::facts::AttemptFacts;
use crate::output::Capture;
use crate::record::tape::{Tape, TapedKv};
use crate::sandbox::Sandbox;
use taskhost_core::logline::LogLevel;

/// The longest key taken, in bytes.
pub const MAX_KV_KEY: usize = 512;
/// The largest value taken, in bytes.
pub const MAX_KV_VALUE: usize = 1 << 20;
/// Keys per page of `list-keys`.
pub const KV_PAGE: usize = 1_000;
/// The default of [`KvLimits::max_bucket_bytes`]: 16 MiB.
pub const DEFAULT_KV_MAX_BUCKET: u64 = 16 << 20;
/// The default of [`KvLimits::max_total_bytes`]: 256 MiB.
pub const DEFAULT_KV_MAX_TOTAL: u64 = 256 << 20;

/// A bucket: a slot's own, or a shared one by name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bucket {
    /// The state of one slot, reached only by the slot's owner.
    Slot(String),
    /// A bucket the operator lets tasks share (`--kv NAME`).
    Shared(String),
}

impl Bucket {
    /// The bucket as one string, as a store keeps it: `slot:NAME` or
    /// `shared:NAME`.
    pub fn scope(&self) -> String {
        let (kind, name) = self.scope_parts();
        [kind, name].concat()
    }

    /// The two parts of its [`scope`](Self::scope): `slot:` or `shared:`,
    /// and its name.
    pub fn scope_parts(&self) -> (&'static str, &str) {
        match self {
            Self::Slot(name) => ("slot:", name),
            Self::Shared(name) => ("shared:", name),
        }
    }

    /// The scope its name is in: the part before
    /// [`SCOPE_SEPARATOR`](taskhost_core::slot_settings::SCOPE_SEPARATOR),
    /// `""` if it has none.
    pub fn scope_name(&self) -> &str {
        let (Self::Slot(name) | Self::Shared(name)) = self;
        name.split_once(taskhost_core::slot_settings::SCOPE_SEPARATOR)
            .map_or("", |(scope, _)| scope)
    }

    /// The bucket a [`scope`](Self::scope) string names.
    pub fn from_scope(scope: &str) -> Option<Self> {
        if let Some(name) = scope.strip_prefix("slot:") {
            Some(Self::Slot(name.to_owned()))
        } else {
            scope
                .strip_prefix("shared:")
                .map(|name| Self::Shared(name.to_owned()))
        }
    }
}

impl std::fmt::Display for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Slot(name) => write!(f, "slot `{name}`"),
            Self::Shared(name) => write!(f, "shared bucket `{name}`"),
        }
    }
}

/// Refuses a shared bucket's name that is empty, long or odd.
pub fn check_bucket_name(name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "invalid bucket name `{name}`: use up to 128 letters, digits, `_`, `-`, `.` or `/`"
        ))
    }
}

/// What went wrong with a key-value operation, for the guest (as
/// `error.other`) and for `host kv`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KvError(pub String);

/// One write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvWrite {
    /// Set a key.
    Set(String, Vec<u8>),
    /// Remove a key.
    Delete(String),
    /// Add to the number a key holds.
    Increment(String, u64),
}

/// A future of a [`KvBackend`].
pub type KvFuture<T> = Pin<Box<dyn Future<Output = Result<T, KvError>> + Send>>;

/// Where buckets live. `task` is the id of the task whose attempt calls,
/// so that a backend may check it still owns what it writes.
pub trait KvBackend: Send + Sync + 'static {
    /// The value of `key`.
    fn get(&self, task: u64, bucket: &Bucket, key: &str) -> KvFuture<Option<Vec<u8>>>;
    /// Applies one write, durably before the future resolves; an increment
    /// gives the new number.
    fn write(&self, task: u64, bucket: &Bucket, write: KvWrite) -> KvFuture<Option<u64>>;
    /// One page of keys in order from `cursor`, and the next cursor.
    fn keys(&self, task: u64, bucket: &Bucket, cursor: u64)
    -> KvFuture<(Vec<String>, Option<u64>)>;
}

/// The caps on state, besides [`MAX_KV_KEY`] and [`MAX_KV_VALUE`]; sizes
/// count keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLimits {
    /// Bytes one bucket may hold.
    pub max_bucket_bytes: u64,
    /// Bytes all buckets together may hold.
    pub max_total_bytes: u64,
}

impl Default for KvLimits {
    fn default() -> Self {
        Self {
            max_bucket_bytes: DEFAULT_KV_MAX_BUCKET,
            max_total_bytes: DEFAULT_KV_MAX_TOTAL,
        }
    }
}

/// What `increment` makes of `key`'s value `current` (decimal text; none
/// is 0): the new value and its number, or why it cannot. Every store
/// increments by this rule.
pub fn incremented(
    key: &str,
    current: Option<&[u8]>,
    delta: u64,
) -> Result<(Vec<u8>, u64), KvError> {
    let now = match current {
        None => 0,
        Some(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|t| t.parse::<u64>().ok())
            .ok_or_else(|| {
                KvError(format!(
                    "cannot increment `{key}`: its value is not a number in decimal"
                ))
            })?,
    };
    let sum = now
        .checked_add(delta)
        .ok_or_else(|| KvError(format!("incrementing `{key}` overflows a u64")))?;
    Ok((sum.to_string().into_bytes(), sum))
}

/// A write as a journal records it: the key's new value, or `None` for a
/// removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvRecord {
    /// The bucket.
    pub bucket: Bucket,
    /// The key.
    pub key: String,
    /// Its value now (`None`: removed).
    pub value: Option<Vec<u8>>,
}

/// Makes writes durable: called in the order writes are applied, its future
/// resolves once the record is kept.
pub type KvJournal = Arc<dyn Fn(KvRecord) -> KvFuture<()> + Send + Sync>;

#[derive(Default)]
struct BucketData {
    bytes: u64,
    entries: BTreeMap<String, Vec<u8>>,
}

#[derive(Default)]
struct Buckets {
    total: u64,
    /// The bytes of each scope's buckets (see [`Bucket::scope_name`]).
    scopes: std::collections::HashMap<String, u64>,
    buckets: BTreeMap<Bucket, BucketData>,
}

impl Buckets {
    /// Counts `old` bytes of `bucket` replaced by `new`.
    fn count(&mut self, bucket: &Bucket, old: u64, new: u64) {
        self.total = self.total - old + new;
        let scope = self
            .scopes
            .entry(bucket.scope_name().to_owned())
            .or_default();
        *scope = *scope - old + new;
        if *scope == 0 {
            self.scopes.remove(bucket.scope_name());
        }
    }
}

/// The quota on the bytes of one scope's buckets: an embedder's namespace,
/// its name before
/// [`SCOPE_SEPARATOR`](taskhost_core::slot_settings::SCOPE_SEPARATOR) in a
/// bucket's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeQuota {
    /// Bytes the scope's buckets may hold together.
    pub bytes: u64,
    /// What a write over it is told after the bytes it would bring, such
    /// as `over namespace `alpha`'s quota … (raise it with …)`.
    pub refusal: String,
}

/// The scopes' quotas on their buckets' bytes, shared by the buckets and
/// whoever sets them.
#[derive(Debug, Default)]
pub struct ScopeQuotas(Mutex<std::collections::HashMap<String, ScopeQuota>>);

impl ScopeQuotas {
    /// Sets (`Some`) or lifts the quota of `scope` (`""`: buckets without one).
    pub fn set(&self, scope: &str, quota: Option<ScopeQuota>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match quota {
            Some(quota) => map.insert(scope.to_owned(), quota),
            None => map.remove(scope),
        };
    }

    /// The quota of `scope`, if it has one.
    pub fn get(&self, scope: &str) -> Option<ScopeQuota> {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(scope).cloned()
    }

    /// Refuses `bytes` in `scope`'s buckets over its quota.
    pub fn check(&self, scope: &str, bytes: u64) -> Result<(), KvError> {
        match self.get(scope) {
            Some(quota) if bytes > quota.bytes => Err(KvError(format!(
                "the write would bring the buckets to {bytes} bytes, {}",
                quota.refusal
            ))),
            _ => Ok(()),
        }
    }
}

/// Every bucket in memory, bounded by its limits; with a journal, each
/// write is kept by it before the caller hears of it.
pub struct MemoryKv {
    limits: KvLimits,
    data: Mutex<Buckets>,
    journal: std::sync::OnceLock<KvJournal>,
    /// How to raise the limits, for the error that names one.
    fix: String,
    /// The scopes' quotas.
    quotas: Arc<ScopeQuotas>,
}

impl std::fmt::Debug for MemoryKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryKv")
            .field("limits", &self.limits)
            .field("durable", &self.journal.get().is_some())
            .finish_non_exhaustive()
    }
}

fn size(key: &str, value: &[u8]) -> u64 {
    (key.len() + value.len()) as u64
}

impl MemoryKv {
    /// Empty buckets under `limits`, nothing kept beyond this process;
    /// `fix` says how to raise a limit (`host serve --kv-max-bucket`).
    pub fn new(limits: KvLimits, fix: impl Into<String>) -> Self {
        Self {
            limits,
            data: Mutex::default(),
            journal: std::sync::OnceLock::new(),
            fix: fix.into(),
            quotas: Arc::default(),
        }
    }

    /// The same, each scope's buckets held to its quota in `quotas`.
    pub fn with_quotas(limits: KvLimits, fix: impl Into<String>, quotas: Arc<ScopeQuotas>) -> Self {
        Self {
            quotas,
            ..Self::new(limits, fix)
        }
    }

    /// The bytes the buckets of `scope` hold together.
    pub fn scope_bytes(&self, scope: &str) -> u64 {
        self.lock().scopes.get(scope).copied().unwrap_or(0)
    }

    /// Keeps every later write with `journal` before it is answered (once:
    /// a second journal is ignored). Set it before the first write.
    pub fn set_journal(&self, journal: KvJournal) {
        let _ = self.journal.set(journal);
    }

    /// Puts back what a journal kept (at start, before any write), past
    /// the limits if need be.
    pub fn load(&self, records: impl IntoIterator<Item = (Bucket, String, Vec<u8>)>) {
        let mut data = self.lock();
        for (bucket, key, value) in records {
            let added = size(&key, &value);
            let entry = data.buckets.entry(bucket.clone()).or_default();
            entry.bytes += added;
            let old = (entry.entries.insert(key.clone(), value)).map_or(0, |old| size(&key, &old));
            entry.bytes -= old;
            data.count(&bucket, old, added);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buckets> {
        self.data.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The buckets with their number of keys and bytes, in order.
    pub fn buckets(&self) -> Vec<(Bucket, usize, u64)> {
        self.lock()
            .buckets
            .iter()
            .map(|(b, d)| (b.clone(), d.entries.len(), d.bytes))
            .collect()
    }

    /// The keys of `bucket` with the size of each value, in order.
    pub fn entries(&self, bucket: &Bucket) -> Vec<(String, u64)> {
        self.lock()
            .buckets
            .get(bucket)
            .map(|d| {
                d.entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.len() as u64))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The value of `key` in `bucket`.
    pub fn value(&self, bucket: &Bucket, key: &str) -> Option<Vec<u8>> {
        self.lock().buckets.get(bucket)?.entries.get(key).cloned()
    }

    /// Applies `write` to memory and hands its record to the journal, both
    /// under the lock (so the journal sees writes in their order); the
    /// returned future resolves once the journal kept it.
    pub fn apply(&self, bucket: &Bucket, write: KvWrite) -> KvFuture<Option<u64>> {
        match self.apply_now(bucket, write) {
            Err(e) => Box::pin(std::future::ready(Err(e))),
            Ok((kept, number)) => Box::pin(async move {
                if let Some(kept) = kept {
                    kept.await?;
                }
                Ok(number)
            }),
        }
    }

    #[allow(clippy::type_complexity)]
    fn apply_now(
        &self,
        bucket: &Bucket,
        write: KvWrite,
    ) -> Result<(Option<KvFuture<()>>, Option<u64>), KvError> {
        let key = &match &write {
            KvWrite::Set(k, _) | KvWrite::Delete(k) | KvWrite::Increment(k, _) => k.clone(),
        };
        if key.len() > MAX_KV_KEY {
            return Err(KvError(format!(
                "the key is {} bytes, over the limit of {MAX_KV_KEY}",
                key.len()
            )));
        }
        let mut data = self.lock();
        let current = data
            .buckets
            .get(bucket)
            .and_then(|d| d.entries.get(key))
            .cloned();
        let (value, number) = match write {
            KvWrite::Delete(_) => (None, None),
            KvWrite::Set(_, value) => (Some(value), None),
            KvWrite::Increment(_, delta) => {
                let (value, sum) = incremented(key, current.as_deref(), delta)?;
                (Some(value), Some(sum))
            }
        };
        if current.is_none() && value.is_none() {
            return Ok((None, None));
        }
        let old = current.as_deref().map_or(0, |v| size(key, v));
        let new = value.as_deref().map_or(0, |v| size(key, v));
        if let Some(v) = &value
            && v.len() > MAX_KV_VALUE
        {
            return Err(KvError(format!(
                "the value is {} bytes, over the limit of {MAX_KV_VALUE}",
                v.len()
            )));
        }
        let bucket_bytes = data.buckets.get(bucket).map_or(0, |d| d.bytes);
        if new > old {
            let grow = new - old;
            if bucket_bytes + grow > self.limits.max_bucket_bytes {
                return Err(KvError(format!(
                    "{bucket} would hold {} bytes, over its limit of {} ({})",
                    bucket_bytes + grow,
                    self.limits.max_bucket_bytes,
                    self.fix
                )));
            }
            if data.total + grow > self.limits.max_total_bytes {
                return Err(KvError(format!(
                    "all buckets would hold {} bytes, over the limit of {} ({})",
                    data.total + grow,
                    self.limits.max_total_bytes,
                    self.fix
                )));
            }
            let scope = bucket.scope_name();
            let held = data.scopes.get(scope).copied().unwrap_or(0);
            self.quotas.check(scope, held + grow)?;
        }
        let kept = self.journal.get().map(|journal| {
            journal(KvRecord {
                bucket: bucket.clone(),
                key: key.clone(),
                value: value.clone(),
            })
        });
        data.count(bucket, old, new);
        let entry = data.buckets.entry(bucket.clone()).or_default();
        entry.bytes = entry.bytes - old + new;
        match value {
            Some(v) => {
                entry.entries.insert(key.clone(), v);
            }
            None => {
                entry.entries.remove(key);
                if entry.entries.is_empty() {
                    data.buckets.remove(bucket);
                }
            }
        }
        Ok((kept, number))
    }
}

impl KvBackend for MemoryKv {
    fn get(&self, _task: u64, bucket: &Bucket, key: &str) -> KvFuture<Option<Vec<u8>>> {
        Box::pin(std::future::ready(Ok(self.value(bucket, key))))
    }

    fn write(&self, _task: u64, bucket: &Bucket, write: KvWrite) -> KvFuture<Option<u64>> {
        self.apply(bucket, write)
    }

    fn keys(
        &self,
        _task: u64,
        bucket: &Bucket,
        cursor: u64,
    ) -> KvFuture<(Vec<String>, Option<u64>)> {
        let data = self.lock();
        let skip = usize::try_from(cursor).unwrap_or(usize::MAX);
        let page: Vec<String> = data
            .buckets
            .get(bucket)
            .map(|d| {
                d.entries
                    .keys()
                    .skip(skip)
                    .take(KV_PAGE + 1)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let (keys, next) = if page.len() > KV_PAGE {
            let mut keys = page;
            keys.truncate(KV_PAGE);
            (keys, Some(cursor + KV_PAGE as u64))
        } else {
            (page, None)
        };
        Box::pin(std::future::ready(Ok((keys, next))))
    }
}

/// The backend of `wasi:keyvalue`, shown by name only.
#[derive(Clone)]
pub(crate) struct KvHandle(pub(crate) Arc<dyn KvBackend>);

impl std::fmt::Debug for KvHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KvBackend")
    }
}

/// What one attempt may reach: the backend, its task and slot, and the
/// shared buckets its task was granted.
#[derive(Clone)]
pub(crate) struct KvAccess {
    /// Whether the attempt has a key-value store (a replay's is its record).
    pub(crate) store: bool,
    /// The real backend (none: no store, or a replay).
    pub(crate) backend: Option<Arc<dyn KvBackend>>,
    /// Where the calls are recorded or replayed from.
    pub(crate) tape: Tape,
    pub(crate) task: u64,
    /// The attempt's facts (its slot) and its task's grants (the shared
    /// buckets), shared with the attempt rather than copied for it.
    pub(crate) facts: Arc<AttemptFacts>,
    pub(crate) sandbox: Arc<Sandbox>,
    pub(crate) capture: Arc<Capture>,
}

/// A bucket a guest opened.
pub struct KvBucket(Bucket);

/// The host side of `wasi:keyvalue` for one attempt.
pub(crate) struct KvView<'a> {
    pub(crate) table: &'a mut ResourceTable,
    pub(crate) access: &'a KvAccess,
}

pub(crate) struct HasKv;

impl HasData for HasKv {
    type Data<'a> = KvView<'a>;
}

type Answer<T> = wasmtime::Result<Result<T, store::Error>>;

fn other(e: KvError) -> store::Error {
    store::Error::Other(e.0)
}

impl KvView<'_> {
    /// The bucket a guest opened, and its calls, through the tape.
    fn bucket(&self, bucket: &Resource<KvBucket>) -> wasmtime::Result<(TapedKv<'_>, Bucket)> {
        let bucket = self.table.get(bucket)?.0.clone();
        let access = self.access;
        let taped = TapedKv {
            tape: &access.tape,
            backend: access.backend.as_deref(),
            task: access.task,
        };
        Ok((taped, bucket))
    }
}

/// A shared bucket as a task of `slot` opens it: a slot with a scope (an
/// embedder's namespace, before
/// [`SCOPE_SEPARATOR`](taskhost_core::slot_settings::SCOPE_SEPARATOR))
/// opens its scope's bucket of that name, so scopes never share one.
pub fn shared_in_scope(slot: &str, name: &str) -> String {
    use taskhost_core::slot_settings::SCOPE_SEPARATOR;
    match slot.split_once(SCOPE_SEPARATOR) {
        Some((scope, _)) => format!("{scope}{SCOPE_SEPARATOR}{name}"),
        None => name.to_owned(),
    }
}

impl store::Host for KvView<'_> {
    async fn open(&mut self, identifier: String) -> Answer<Resource<KvBucket>> {
        if !self.access.store {
            return Ok(Err(store::Error::Other(
                "this runtime has no key-value store (RuntimeConfig::key_value)".into(),
            )));
        }
        let bucket = if identifier.is_empty() {
            Bucket::Slot(self.access.facts.slot.clone())
        } else if self.access.sandbox.kv.contains(&identifier) {
            Bucket::Shared(shared_in_scope(&self.access.facts.slot, &identifier))
        } else {
            self.access.capture.log(
                LogLevel::Warn,
                &format!(
                    "key-value bucket `{identifier}` is not granted to this task: submit it \
                     with --kv {identifier} (open \"\" for the slot's own)"
                ),
            );
            return Ok(Err(store::Error::AccessDenied));
        };
        Ok(Ok(self.table.push(KvBucket(bucket))?))
    }
}

impl store::HostBucket for KvView<'_> {
    async fn get(&mut self, bucket: Resource<KvBucket>, key: String) -> Answer<Option<Vec<u8>>> {
        let (kv, bucket) = self.bucket(&bucket)?;
        Ok(kv.get(&bucket, &key).await.map_err(other))
    }

    async fn set(&mut self, bucket: Resource<KvBucket>, key: String, value: Vec<u8>) -> Answer<()> {
        let (kv, bucket) = self.bucket(&bucket)?;
        let written = kv.write(&bucket, KvWrite::Set(key, value)).await;
        Ok(written.map(|_| ()).map_err(other))
    }

    async fn delete(&mut self, bucket: Resource<KvBucket>, key: String) -> Answer<()> {
        let (kv, bucket) = self.bucket(&bucket)?;
        let written = kv.write(&bucket, KvWrite::Delete(key)).await;
        Ok(written.map(|_| ()).map_err(other))
    }

    async fn exists(&mut self, bucket: Resource<KvBucket>, key: String) -> Answer<bool> {
        let (kv, bucket) = self.bucket(&bucket)?;
        Ok(kv
            .get(&bucket, &key)
            .await
            .map(|v| v.is_some())
            .map_err(other))
    }

    async fn list_keys(
        &mut self,
        bucket: Resource<KvBucket>,
        cursor: Option<u64>,
    ) -> Answer<store::KeyResponse> {
        let (kv, bucket) = self.bucket(&bucket)?;
        Ok(kv
            .keys(&bucket, cursor.unwrap_or(0))
            .await
            .map(|(keys, cursor)| store::KeyResponse { keys, cursor })
            .map_err(other))
    }

    async fn drop(&mut self, bucket: Resource<KvBucket>) -> wasmtime::Result<()> {
        self.table.delete(bucket)?;
        Ok(())
    }
}

impl atomics::Host for KvView<'_> {
    async fn increment(
        &mut self,
        bucket: Resource<KvBucket>,
        key: String,
        delta: u64,
    ) -> Answer<u64> {
        let (kv, bucket) = self.bucket(&bucket)?;
        let written = kv.write(&bucket, KvWrite::Increment(key, delta)).await;
        Ok(written.map(|n| n.unwrap_or_default()).map_err(other))
    }
}

impl batch::Host for KvView<'_> {
    async fn get_many(
        &mut self,
        bucket: Resource<KvBucket>,
        keys: Vec<String>,
    ) -> Answer<Vec<Option<(String, Vec<u8>)>>> {
        let (kv, bucket) = self.bucket(&bucket)?;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            match kv.get(&bucket, &key).await {
                Ok(value) => out.push(value.map(|v| (key, v))),
                Err(e) => return Ok(Err(other(e))),
            }
        }
        Ok(Ok(out))
    }

    async fn set_many(
        &mut self,
        bucket: Resource<KvBucket>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> Answer<()> {
        let (kv, bucket) = self.bucket(&bucket)?;
        for (key, value) in key_values {
            if let Err(e) = kv.write(&bucket, KvWrite::Set(key, value)).await {
                return Ok(Err(other(e)));
            }
        }
        Ok(Ok(()))
    }

    async fn delete_many(&mut self, bucket: Resource<KvBucket>, keys: Vec<String>) -> Answer<()> {
        let (kv, bucket) = self.bucket(&bucket)?;
        for key in keys {
            if let Err(e) = kv.write(&bucket, KvWrite::Delete(key)).await {
                return Ok(Err(other(e)));
            }
        }
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block<T>(f: KvFuture<T>) -> Result<T, KvError> {
        futures::executor::block_on(f)
    }

    #[test]
    fn limits_and_increments() {
        let kv = MemoryKv::new(
            KvLimits {
                max_bucket_bytes: 10,
                max_total_bytes: 15,
            },
            "raise it",
        );
        let a = Bucket::Slot("a".into());
        let b = Bucket::Slot("b".into());
        block(kv.write(1, &a, KvWrite::Set("k".into(), b"1234".to_vec()))).unwrap();
        let err = block(kv.write(1, &a, KvWrite::Set("j".into(), b"12345".to_vec()))).unwrap_err();
        assert!(err.0.contains("slot `a` would hold 11 bytes"), "{err}");
        // Replacing a value counts only the difference.
        block(kv.write(1, &a, KvWrite::Set("k".into(), b"12345678".to_vec()))).unwrap();
        let err =
            block(kv.write(1, &b, KvWrite::Set("k".into(), b"1234567".to_vec()))).unwrap_err();
        assert!(err.0.contains("all buckets would hold 17"), "{err}");
        block(kv.write(1, &a, KvWrite::Delete("k".into()))).unwrap();
        assert_eq!(kv.buckets(), []);
        assert_eq!(
            block(kv.write(1, &b, KvWrite::Increment("n".into(), 2))).unwrap(),
            Some(2)
        );
        assert_eq!(
            block(kv.write(1, &b, KvWrite::Increment("n".into(), 3))).unwrap(),
            Some(5)
        );
        assert_eq!(kv.value(&b, "n").unwrap(), b"5");
        assert_eq!(block(kv.get(1, &a, "n")).unwrap(), None);
    }

    #[test]
    fn keys_come_in_pages() {
        let kv = MemoryKv::new(KvLimits::default(), "");
        let a = Bucket::Shared("s".into());
        for i in 0..(KV_PAGE + 5) {
            block(kv.write(1, &a, KvWrite::Set(format!("{i:05}"), vec![]))).unwrap();
        }
        let (first, next) = block(kv.keys(1, &a, 0)).unwrap();
        assert_eq!((first.len(), next), (KV_PAGE, Some(KV_PAGE as u64)));
        let (rest, next) = block(kv.keys(1, &a, next.unwrap())).unwrap();
        assert_eq!((rest.len(), next), (5, None));
        assert_eq!(Bucket::from_scope(&a.scope()), Some(a));
    }
}
