//! Owns the daemon's state directory as a place: where it is by default (a
//! directory of the user's own, never a shared one), that it is private
//! (created 0700; refused when another user owns it or others may write to
//! it; tightened when others may only read it), and that one daemon at a
//! time uses it (an exclusive `flock` on `taskhost.lock`, taken before the
//! store is opened and recovered, holding the daemon's pid and socket).

use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::wire::socket::current_uid;

/// The lock file's name inside the state directory.
pub const LOCK_FILE: &str = "taskhost.lock";

/// The state directory default: `$XDG_STATE_HOME/taskhost`, else
/// `$HOME/.local/state/taskhost`, else the same under the home directory
/// `/etc/passwd` gives this user. Never a shared directory such as `/tmp`:
/// without any of them it says what to set.
pub fn default_state_dir() -> Result<PathBuf, String> {
    let absolute = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(dir) = absolute(std::env::var_os("XDG_STATE_HOME")) {
        return Ok(dir.join("taskhost"));
    }
    let home = absolute(std::env::var_os("HOME")).or_else(passwd_home);
    match home {
        Some(home) => Ok(home.join(".local").join("state").join("taskhost")),
        None => Err(
            "there is no state directory to use: neither XDG_STATE_HOME nor HOME is set and \
             /etc/passwd names no home directory for this user; give --state-dir DIR (a \
             directory only this user can use), or set HOME"
                .to_owned(),
        ),
    }
}

/// This user's home directory according to `/etc/passwd`, if it exists.
fn passwd_home() -> Option<PathBuf> {
    let uid = current_uid()?.to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        // `nobody`'s `/nonexistent` and the like are no home.
        (fields.len() >= 7 && fields[2] == uid && fields[5] != "/" && Path::new(fields[5]).is_dir())
            .then(|| PathBuf::from(fields[5]))
    })
}

/// Creates the state directory owner-only, or checks an existing one: it
/// must be a directory of this user's that nobody else can write to. One
/// that others may read (made by an older taskhost) is made 0700, with a
/// warning.
pub fn prepare(dir: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create the state directory `{}`: {e}", dir.display())),
        Err(e) => Err(format!(
            "cannot use the state directory `{}`: {e}",
            dir.display()
        )),
        Ok(meta) => {
            let meta = if meta.file_type().is_symlink() {
                std::fs::metadata(dir).map_err(|e| {
                    format!("cannot use the state directory `{}`: {e}", dir.display())
                })?
            } else {
                meta
            };
            if !meta.is_dir() {
                return Err(format!(
                    "the state directory `{}` is not a directory; give --state-dir a directory",
                    dir.display()
                ));
            }
            if let Some(uid) = current_uid()
                && meta.uid() != uid
            {
                return Err(format!(
                    "the state directory `{}` belongs to another user (uid {}); the daemon keeps \
                     its tasks' inputs, outputs and compiled code there, so it must be yours: \
                     give --state-dir a directory of your own",
                    dir.display(),
                    meta.uid()
                ));
            }
            let mode = meta.mode() & 0o777;
            if mode & 0o022 != 0 {
                return Err(format!(
                    "the state directory `{}` is writable by others (mode {mode:o}): anyone \
                     could replace its store or compiled code; make it private with `chmod 700 \
                     {}`, or give --state-dir another directory",
                    dir.display(),
                    dir.display()
                ));
            }
            if mode & 0o077 != 0 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(
                    |e| {
                        format!(
                            "the state directory `{}` is readable by others (mode {mode:o}) and \
                             cannot be made private: {e}",
                            dir.display()
                        )
                    },
                )?;
                tracing::warn!(
                    "the state directory {} was readable by others (mode {mode:o}); it is now 0700",
                    dir.display()
                );
            }
            Ok(())
        }
    }
}

/// The exclusive claim of one daemon on a state directory (or a store file
/// outside it); released when dropped, or by the kernel when the process
/// dies, so a killed daemon never leaves a stale lock.
#[derive(Debug)]
pub struct StateLock {
    _file: std::fs::File,
}

impl StateLock {
    /// Takes the lock at `path`, recording this daemon's pid and socket in
    /// it; refuses, naming the holder, when another process has it.
    pub fn acquire(path: &Path, socket: &Path, what: &str) -> Result<Self, String> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("cannot open the lock file `{}`: {e}", path.display()))?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let mut lines = holder.lines();
                let pid = lines.next().unwrap_or("?");
                let their_socket = lines.next().unwrap_or("?");
                return Err(format!(
                    "another daemon (pid {pid}, socket {their_socket}) is using {what}; one \
                     daemon at a time may use it. Stop that one (`host --socket {their_socket} \
                     shutdown`), or give this one another --state-dir"
                ));
            }
            Err(e) => {
                return Err(format!("cannot lock `{}`: {e}", path.display()));
            }
        }
        let record = format!("{}\n{}\n", std::process::id(), socket.display());
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(record.as_bytes()))
            .map_err(|e| format!("cannot write the lock file `{}`: {e}", path.display()))?;
        Ok(Self { _file: file })
    }
}
