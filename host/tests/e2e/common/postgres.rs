//! A throwaway PostgreSQL server for the cluster tests: `initdb` and
//! `pg_ctl` from Debian's `postgresql` package (`.ci/run` installs it), in a
//! temporary directory, listening only on a Unix socket there, as an
//! unprivileged user (the server refuses to run as root). Stopped on drop.
//! When it cannot start, the test fails with the reason: these tests never
//! skip. Include it with `#[path = "common/postgres.rs"] mod postgres;`.

#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The user the server runs as when the tests run as root.
const NOBODY: u32 = 65534;

pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    as_nobody: bool,
}

/// The directory holding `initdb`, `pg_ctl` and `psql`: on the PATH, else
/// Debian's newest `/usr/lib/postgresql/N/bin`.
fn find_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            // Debian links initdb and pg_ctl onto the PATH; psql sits
            // beside the real ones.
            if dir.join("initdb").is_file()
                && let Ok(real) = std::fs::canonicalize(dir.join("initdb"))
                && let Some(bin) = real.parent()
                && bin.join("pg_ctl").is_file()
                && bin.join("psql").is_file()
            {
                return bin.to_path_buf();
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL is not installed: no initdb on the PATH or under /usr/lib/postgresql. \
             The cluster tests need a real server: `apt-get install postgresql` (.ci/run does)"
        ),
    }
}

impl Postgres {
    /// Creates and starts a fresh server.
    pub fn start() -> Self {
        let bin = find_bin();
        // Short: the socket path must fit in 107 bytes.
        let dir = tempfile::Builder::new()
            .prefix("thpg")
            .tempdir_in("/tmp")
            .expect("tempdir for PostgreSQL");
        let as_nobody = std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(0)
            == 0;
        if as_nobody {
            std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY))
                .expect("chown the PostgreSQL directory to nobody");
        }
        let pg = Self {
            dir,
            bin,
            as_nobody,
        };
        let data = pg.data();
        pg.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "taskhost",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        let options = format!(
            "-c listen_addresses='' -c unix_socket_directories='{}' -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off -c max_connections=300",
            pg.dir.path().display()
        );
        let log = pg.dir.path().join("server.log");
        pg.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "-o",
                &options,
                "start",
            ],
        );
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The directory of the server's socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        let mut cmd = if self.as_nobody {
            let mut cmd = Command::new("setpriv");
            cmd.args([
                "--reuid",
                &NOBODY.to_string(),
                "--regid",
                &NOBODY.to_string(),
                "--clear-groups",
                "--",
            ]);
            cmd.arg(path);
            cmd
        } else {
            Command::new(path)
        };
        cmd.current_dir(self.dir.path()).env("LC_ALL", "C");
        cmd
    }

    fn run(&self, tool: &str, args: &[&str]) -> String {
        let out = self
            .command(tool)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {tool} (from {}): {e}", self.bin.display()));
        if !out.status.success() {
            let log =
                std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
            panic!(
                "PostgreSQL's {tool} failed ({}):\n{}\n{}\nserver log:\n{log}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The server's main process.
    pub fn postmaster_pid(&self) -> u32 {
        let pid = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .expect("postmaster.pid of a running server");
        pid.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a pid on postmaster.pid's first line")
    }

    /// The address for `host serve --store`.
    pub fn url(&self) -> String {
        format!(
            "postgresql:///postgres?host={}&user=taskhost",
            self.dir.path().display()
        )
    }

    /// Runs SQL through `psql`; returns its unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> String {
        let dir = self.dir.path().to_str().unwrap().to_owned();
        self.run(
            "psql",
            &[
                "-h",
                &dir,
                "-U",
                "taskhost",
                "-d",
                "postgres",
                "-At",
                "-F",
                "|",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args([
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ])
            .output();
    }
}
