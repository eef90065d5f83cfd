//! Key-value state through `wasi:keyvalue` (0.2.0-draft): [`Bucket::slot`]
//! is the task's slot's own bucket, which only the slot's owner reaches at
//! any time, so a read followed by a write loses no update;
//! [`Bucket::shared`] opens a bucket the submission was granted with
//! `--kv NAME`, which tasks of other slots may write too (use
//! [`Bucket::increment`] there).
//!
//! In a daemon each write is in its store before the call returns: a
//! retried attempt, or the next task of the slot after a crash, reads what
//! the last attempt wrote (nothing is rolled back when an attempt fails).
//! `host run` keeps buckets for the process only.
//!
//! ```no_run
//! use taskhost_guest::{Context, PluginInfo, Task, TaskError, kv};
//!
//! struct Count;
//!
//! impl Task for Count {
//!     fn describe() -> PluginInfo {
//!         PluginInfo::new("count", "0.1.0")
//!     }
//!
//!     fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
//!         let state = kv::Bucket::slot()?;
//!         let runs = state.increment("runs", 1)?;
//!         let previous = state.get_string("last")?.unwrap_or_default();
//!         state.set("last", &input)?;
//!         Ok(format!("run {runs}, previous input {previous:?}").into_bytes())
//!     }
//! }
//!
//! taskhost_guest::export_task!(Count);
//! ```
//!
//! A plugin that uses none of this does not import the interfaces.

use crate::TaskError;

#[allow(missing_docs, clippy::all)]
mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "wasi:keyvalue/imports@0.2.0-draft",
        generate_all,
    });
}

use bindings::wasi::keyvalue::{atomics, store};

/// An open bucket.
pub struct Bucket {
    inner: store::Bucket,
    name: String,
}

fn failed(what: &str, name: &str, err: store::Error) -> TaskError {
    match err {
        store::Error::AccessDenied => TaskError::fatal(format!(
            "{what}: bucket `{name}` is not granted to this task (submit it with --kv {name})"
        )),
        store::Error::NoSuchStore => TaskError::fatal(format!("{what}: no bucket `{name}`")),
        store::Error::Other(why) => TaskError::fail(format!("{what}: {why}")),
    }
}

impl Bucket {
    /// The task's slot's own bucket.
    pub fn slot() -> Result<Self, TaskError> {
        Self::open("")
    }

    /// A shared bucket the submission was granted (`--kv NAME`).
    pub fn shared(name: &str) -> Result<Self, TaskError> {
        Self::open(name)
    }

    fn open(name: &str) -> Result<Self, TaskError> {
        let inner = store::open(name).map_err(|e| failed("open", name, e))?;
        Ok(Self {
            inner,
            name: name.to_owned(),
        })
    }

    /// The value of `key`, if any.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, TaskError> {
        self.inner
            .get(key)
            .map_err(|e| failed("get", &self.name, e))
    }

    /// The value of `key` as text (a value that is not UTF-8 is an error).
    pub fn get_string(&self, key: &str) -> Result<Option<String>, TaskError> {
        match self.get(key)? {
            None => Ok(None),
            Some(bytes) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| TaskError::fail(format!("the value of `{key}` is not UTF-8 text"))),
        }
    }

    /// Sets `key` to `value`; kept before this returns.
    pub fn set(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), TaskError> {
        self.inner
            .set(key, value.as_ref())
            .map_err(|e| failed("set", &self.name, e))
    }

    /// Removes `key` (nothing if it is not there).
    pub fn delete(&self, key: &str) -> Result<(), TaskError> {
        self.inner
            .delete(key)
            .map_err(|e| failed("delete", &self.name, e))
    }

    /// Whether `key` has a value.
    pub fn exists(&self, key: &str) -> Result<bool, TaskError> {
        self.inner
            .exists(key)
            .map_err(|e| failed("exists", &self.name, e))
    }

    /// Every key, in order.
    pub fn keys(&self) -> Result<Vec<String>, TaskError> {
        let mut keys = Vec::new();
        let mut cursor = None;
        loop {
            let page = self
                .inner
                .list_keys(cursor)
                .map_err(|e| failed("list-keys", &self.name, e))?;
            keys.extend(page.keys);
            match page.cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(keys),
            }
        }
    }

    /// Adds `delta` to the number `key` holds (decimal text; none is 0) in
    /// one step, and returns the sum.
    pub fn increment(&self, key: &str, delta: u64) -> Result<u64, TaskError> {
        atomics::increment(&self.inner, key, delta).map_err(|e| failed("increment", &self.name, e))
    }
}
