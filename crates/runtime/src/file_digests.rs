//! Owns the memo of plugin files' digests in the cache directory, so that a
//! warm `host run` of a large plugin neither reads nor hashes it: a file
//! whose device, inode, size, modification and change times are those
//! recorded has the recorded digest. It must not record a file that could
//! still change under the same times: only files whose status was the same
//! before and after they were read, and whose last change is older than
//! [`SETTLED`], are recorded (a write to a file sets its change time, which
//! no user but root can set back). The temporary names that its records
//! and `artifacts`' files are written through are here too.

#![forbid(unsafe_code)]

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest as _, Sha256};

use super::digest::Digest;

/// How long a file must have been unchanged before its digest is recorded:
/// far longer than any file system's timestamp granularity.
const SETTLED: Duration = Duration::from_secs(2);

/// Records not used for this long are deleted when artifacts are evicted.
pub(crate) const STALE: Duration = Duration::from_secs(30 * 24 * 3600);

/// The extension of a record.
pub(crate) const EXTENSION: &str = "digest";

/// What identifies one version of a file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct FileStatus {
    path: PathBuf,
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileStatus {
    /// The status of `path` as `meta` (from `stat`, following links) tells.
    pub(crate) fn new(path: &Path, meta: &std::fs::Metadata) -> Self {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Self {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }

    fn settled(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        self.ctime_ns.max(self.mtime_ns) < now - SETTLED.as_nanos() as i128
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    status: FileStatus,
    digest: Digest,
}

/// The record file of `path` in `dir`.
fn record_path(dir: &Path, path: &Path) -> PathBuf {
    let key: String = Sha256::digest(path.as_os_str().as_encoded_bytes())[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    dir.join(format!("{key}.{EXTENSION}"))
}

/// The digest recorded for this exact version of the file, if any.
pub(crate) fn known(dir: &Path, status: &FileStatus) -> Option<Digest> {
    let text = std::fs::read(record_path(dir, &status.path)).ok()?;
    let record: Record = serde_json::from_slice(&text).ok()?;
    (record.status == *status).then_some(record.digest)
}

/// Records `digest` for the file whose status was `before` when it was
/// read and `after` once read, if the two agree and the file has settled.
/// Best effort.
pub(crate) fn remember(dir: &Path, before: &FileStatus, after: &FileStatus, digest: Digest) {
    if before != after || !before.settled() {
        return;
    }
    let record = Record {
        status: before.clone(),
        digest,
    };
    let Ok(text) = serde_json::to_vec(&record) else {
        return;
    };
    let path = record_path(dir, &before.path);
    let tmp = temporary_name(&path);
    let written = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&tmp)
        .and_then(|mut file| file.write_all(&text))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// A name beside `path` that no other writer uses: this process's id and
/// a count of its writes (several runtimes of one process may store the
/// same plugin at once). Records and artifacts (`artifacts`) are written
/// through it, and their eviction deletes what a dead writer left.
pub(crate) fn temporary_name(path: &Path) -> PathBuf {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    path.with_extension(format!("tmp{}-{n}", std::process::id()))
}
