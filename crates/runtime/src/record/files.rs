//! Owns reads through directory grants on a tape. Recording, each
//! `open-at` of a file or directory to read (not to write, create or
//! truncate) under a granted directory is a call ([`Ask::Open`]: the
//! grant's guest path and the path in it); its answer is the file's whole
//! content as it was opened (a directory: none), or the error code. A
//! file larger than what the record's budget leaves ends the record
//! there, truncated. Replaying, each grant is a fresh directory preopened
//! read-only at the same guest path; each open writes the recorded
//! content there first (or answers the recorded error), so the guest reads
//! what the recorded one read. Each entry the guest reads from a listing
//! of a directory there is a call too (its type and name); replaying, the
//! entries are the recorded ones, in the recorded order, and each is made
//! there (an empty file, a directory) if it is not yet. Metadata (times,
//! the sizes of files not opened, permissions) are the replay's own.
//! Where a descriptor lies is read from the operating system
//! (`/proc/self/fd`), so this works on Linux.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemView};
use wasmtime_wasi::p2::ReaddirIterator;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorFlags, DescriptorType, DirectoryEntry, ErrorCode, HostDescriptor,
    HostDirectoryEntryStream, OpenFlags,
};

use super::format::{Answer, Ask};
use super::tape::Tape;
use crate::limits::{FILESYSTEM_TYPES, Limited};

/// The granted directories of one attempt on its tape.
pub(crate) struct FileTape {
    tape: Tape,
    /// Each grant: where it is on the host (canonical) and its guest path.
    roots: Vec<(PathBuf, String)>,
    /// The listings open under a grant, by their stream's handle.
    listings: Mutex<HashMap<u32, Located>>,
}

/// Where an open lies: the grant's guest path, the path in it, and the
/// grant's host directory.
#[derive(Clone)]
pub(crate) struct Located {
    dir: String,
    path: String,
    root: PathBuf,
}

impl FileTape {
    /// The tape of grants at `roots` (host directory, guest path); none
    /// when the tape is off or there are none.
    pub(crate) fn new(tape: &Tape, roots: &[(PathBuf, String)]) -> Option<Arc<Self>> {
        if !tape.is_on() || roots.is_empty() {
            return None;
        }
        let roots = roots
            .iter()
            .filter_map(|(host, guest)| Some((host.canonicalize().ok()?, guest.clone())))
            .collect();
        Some(Arc::new(Self {
            tape: tape.clone(),
            roots,
            listings: Mutex::default(),
        }))
    }

    /// Where `path`, opened from `base` with these flags, lies, if the
    /// open is one the tape takes: to read, under a grant.
    pub(crate) fn locate(
        &self,
        base: &Descriptor,
        path: &str,
        open_flags: OpenFlags,
        flags: DescriptorFlags,
    ) -> Option<Located> {
        let writes = OpenFlags::CREATE | OpenFlags::TRUNCATE | OpenFlags::EXCLUSIVE;
        if !flags.contains(DescriptorFlags::READ)
            || flags.intersects(DescriptorFlags::WRITE | DescriptorFlags::MUTATE_DIRECTORY)
            || open_flags.intersects(writes)
        {
            return None;
        }
        let Descriptor::Dir(base) = base else {
            return None;
        };
        let host = std::fs::read_link(format!("/proc/self/fd/{}", base.dir.as_raw_fd())).ok()?;
        self.roots.iter().find_map(|(root, guest)| {
            let inside = host.strip_prefix(root).ok()?;
            Some(Located {
                dir: guest.clone(),
                path: normalize(inside, path)?,
                root: root.clone(),
            })
        })
    }

    /// Replaying, readies the open of `at`: writes the recorded content
    /// (or makes the directory) under the replay's grant, or answers the
    /// recorded error. Recording, nothing.
    pub(crate) fn before(&self, at: &Located) -> Result<(), ErrorCode> {
        if !matches!(self.tape, Tape::Replay(_)) {
            return Ok(());
        }
        let answer = self.tape.call(|| at.ask(), unreachable_answer);
        let host = at.root.join(&at.path);
        match answer {
            Ok(Answer::Opened(Ok(Some(content)))) => {
                if let Some(parent) = host.parent() {
                    std::fs::create_dir_all(parent).map_err(|_| ErrorCode::Io)?;
                }
                std::fs::write(&host, content).map_err(|_| ErrorCode::Io)
            }
            Ok(Answer::Opened(Ok(None))) => {
                std::fs::create_dir_all(&host).map_err(|_| ErrorCode::Io)
            }
            Ok(Answer::Opened(Err(code))) => Err(code_of(&code)),
            // A stop (the guest traps at its next check) or a damaged record.
            _ => Err(ErrorCode::Io),
        }
    }

    /// Recording, keeps the open of `at` that gave `opened` (the new
    /// descriptor, or the error): the file's content as it is now.
    pub(crate) fn after(&self, at: &Located, opened: Result<&Descriptor, &ErrorCode>) {
        let Tape::Record(recording) = &self.tape else {
            return;
        };
        let answer = match opened {
            Ok(Descriptor::Dir(_)) => Ok(None),
            Ok(Descriptor::File(file)) => {
                let size = file.file.metadata().map_or(0, |m| m.len());
                if usize::try_from(size).map_or(true, |s| s > recording.room()) {
                    // Past the budget: the record ends here.
                    let reserved = recording.reserve(at.ask());
                    recording.fill(reserved, None);
                    return;
                }
                read_all(&file.file).map(Some).map_err(|e| format!("{e}"))
            }
            Err(code) => Err(format!("{code:?}")),
        };
        let _ = self.tape.call(|| at.ask(), || Answer::Opened(answer));
    }
}

impl FileTape {
    fn listings(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Located>> {
        self.listings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next entry of listing `at`: recording, `real`'s, kept;
    /// replaying, the recorded one, made in the replay's directory.
    fn entry(
        &self,
        at: &Located,
        real: Option<Result<Option<DirectoryEntry>, ErrorCode>>,
    ) -> Result<Option<DirectoryEntry>, ErrorCode> {
        let ask = || Ask::Entry {
            dir: at.dir.clone(),
            path: at.path.clone(),
        };
        let Some(real) = real else {
            return match self.tape.call(ask, || Answer::Entry(Err("Io".into()))) {
                Ok(Answer::Entry(Ok(Some((kind, name))))) => {
                    let kind = kind_of(kind);
                    let host = at.root.join(&at.path).join(&name);
                    let made = if kind == DescriptorType::Directory {
                        std::fs::create_dir_all(&host)
                    } else if host.symlink_metadata().is_err() {
                        std::fs::write(&host, b"")
                    } else {
                        Ok(())
                    };
                    made.map_err(|_| ErrorCode::Io)?;
                    Ok(Some(DirectoryEntry { type_: kind, name }))
                }
                Ok(Answer::Entry(Ok(None))) => Ok(None),
                Ok(Answer::Entry(Err(code))) => Err(code_of(&code)),
                _ => Err(ErrorCode::Io),
            };
        };
        let answer = match &real {
            Ok(entry) => Ok(entry.as_ref().map(|e| (number_of(e.type_), e.name.clone()))),
            Err(code) => Err(format!("{code:?}")),
        };
        let _ = self.tape.call(ask, || Answer::Entry(answer));
        real
    }
}

/// Replaces wasmtime-wasi's `read-directory` and `read-directory-entry`
/// (linked before this) with ones that put the listings of directories
/// under a grant on the attempt's tape, if it has one.
pub(crate) fn wrap_listings<T: Limited>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.read-directory",
        |mut store: StoreContextMut<'_, T>, (dir,): (Resource<Descriptor>,)| {
            Box::new(async move {
                let state = store.data_mut();
                let taped = state.file_tape().and_then(|tape| {
                    let table = state.ctx().table;
                    let base = table.get(&dir).ok()?;
                    let at = tape.locate(base, ".", OpenFlags::empty(), DescriptorFlags::READ)?;
                    Some((tape, at))
                });
                let mut view = state.filesystem();
                let listed = match HostDescriptor::read_directory(&mut view, dir).await {
                    Ok(listed) => Ok(listed),
                    Err(err) => Err(err.downcast()?),
                };
                if let (Some((tape, at)), Ok(listed)) = (&taped, &listed) {
                    tape.listings().insert(listed.rep(), at.clone());
                } else if let (Some(tape), Ok(listed)) = (state.file_tape(), &listed) {
                    tape.listings().remove(&listed.rep());
                }
                Ok((listed,))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]directory-entry-stream.read-directory-entry",
        |mut store: StoreContextMut<'_, T>, (stream,): (Resource<ReaddirIterator>,)| {
            Box::new(async move {
                let state = store.data_mut();
                let tape = state.file_tape();
                let at = tape
                    .as_ref()
                    .and_then(|t| t.listings().get(&stream.rep()).cloned());
                if let (Some(tape), Some(at)) = (&tape, &at)
                    && matches!(tape.tape, Tape::Replay(_))
                {
                    return Ok((tape.entry(at, None),));
                }
                let mut view = state.filesystem();
                let real =
                    match HostDirectoryEntryStream::read_directory_entry(&mut view, stream).await {
                        Ok(entry) => Ok(entry),
                        Err(err) => Err(err.downcast()?),
                    };
                match (&tape, &at) {
                    (Some(tape), Some(at)) => Ok((tape.entry(at, Some(real)),)),
                    _ => Ok((real,)),
                }
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The kinds of entries, in the order of the WIT enum.
const KINDS: [DescriptorType; 8] = [
    DescriptorType::Unknown,
    DescriptorType::BlockDevice,
    DescriptorType::CharacterDevice,
    DescriptorType::Directory,
    DescriptorType::Fifo,
    DescriptorType::SymbolicLink,
    DescriptorType::RegularFile,
    DescriptorType::Socket,
];

fn number_of(kind: DescriptorType) -> u8 {
    KINDS
        .iter()
        .position(|k| *k == kind)
        .and_then(|n| u8::try_from(n).ok())
        .unwrap_or(0)
}

fn kind_of(number: u8) -> DescriptorType {
    KINDS
        .get(usize::from(number))
        .copied()
        .unwrap_or(DescriptorType::Unknown)
}

impl Located {
    fn ask(&self) -> Ask {
        Ask::Open {
            dir: self.dir.clone(),
            path: self.path.clone(),
        }
    }
}

/// A replay's tape never runs the real call.
fn unreachable_answer() -> Answer {
    Answer::Opened(Err("Io".into()))
}

/// A file's whole content, read from its start whatever its position.
fn read_all(file: &std::fs::File) -> std::io::Result<Vec<u8>> {
    let mut content = Vec::new();
    let mut chunk = vec![0; 64 << 10];
    loop {
        let n = file.read_at(&mut chunk, content.len() as u64)?;
        if n == 0 {
            return Ok(content);
        }
        content.extend_from_slice(&chunk[..n]);
    }
}

/// `path` opened from `inside` (a directory in a grant), as a path in the
/// grant without `.` or `..`; none if it leaves the grant.
fn normalize(inside: &Path, path: &str) -> Option<String> {
    let mut parts: Vec<String> = inside
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part.to_owned()),
        }
    }
    Some(parts.join("/"))
}

/// The error code a recorded name stands for (`Io` if none).
fn code_of(name: &str) -> ErrorCode {
    use ErrorCode as E;
    [
        E::Access,
        E::WouldBlock,
        E::Already,
        E::BadDescriptor,
        E::Busy,
        E::Deadlock,
        E::Quota,
        E::Exist,
        E::FileTooLarge,
        E::IllegalByteSequence,
        E::InProgress,
        E::Interrupted,
        E::Invalid,
        E::Io,
        E::IsDirectory,
        E::Loop,
        E::TooManyLinks,
        E::MessageSize,
        E::NameTooLong,
        E::NoDevice,
        E::NoEntry,
        E::NoLock,
        E::InsufficientMemory,
        E::InsufficientSpace,
        E::NotDirectory,
        E::NotEmpty,
        E::NotRecoverable,
        E::Unsupported,
        E::NoTty,
        E::NoSuchDevice,
        E::Overflow,
        E::NotPermitted,
        E::Pipe,
        E::ReadOnly,
        E::InvalidSeek,
        E::TextFileBusy,
        E::CrossDevice,
    ]
    .into_iter()
    .find(|code| format!("{code:?}") == name)
    .unwrap_or(E::Io)
}

/// A replay's stand-ins for the recorded grants: one fresh directory per
/// grant, removed when dropped.
pub(crate) struct ReplayDirs {
    /// Each: the fresh directory and the grant's guest path.
    pub(crate) dirs: Vec<(PathBuf, String)>,
}

impl ReplayDirs {
    /// Fresh directories for the grants at these guest paths.
    pub(crate) fn new(guests: &[String]) -> std::io::Result<Self> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let base =
            std::env::temp_dir().join(format!("taskhost-replay-{}-{stamp}", std::process::id()));
        let mut dirs = Vec::new();
        for (n, guest) in guests.iter().enumerate() {
            let dir = base.join(n.to_string());
            std::fs::create_dir_all(&dir)?;
            dirs.push((dir, guest.clone()));
        }
        Ok(Self { dirs })
    }
}

impl Drop for ReplayDirs {
    fn drop(&mut self) {
        if let Some(base) = self.dirs.first().and_then(|(d, _)| d.parent()) {
            let _ = std::fs::remove_dir_all(base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalized_within_their_grant() {
        let at = |inside: &str, path: &str| normalize(Path::new(inside), path);
        assert_eq!(at("", "a/./b//c").as_deref(), Some("a/b/c"));
        assert_eq!(at("sub", "../x").as_deref(), Some("x"));
        assert_eq!(at("", "../x"), None);
        assert_eq!(
            code_of(&format!("{:?}", ErrorCode::NoEntry)),
            ErrorCode::NoEntry
        );
    }
}
