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
    /// The TCP port on 127.0.0.1 of a server started with TLS.
    tls_port: Option<u16>,
    /// The server's settings (`pg_ctl -o`), for a start after a stop.
    options: String,
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
        Self::start_with(false, "")
    }

    /// A fresh server with more `-c name=value` settings (the benchmark's
    /// profile preloads pg_stat_statements).
    pub fn start_with_settings(settings: &str) -> Self {
        Self::start_with(false, settings)
    }

    /// A fresh server that also listens on 127.0.0.1 (a free port), with
    /// TLS on: its certificate, for `localhost` and 127.0.0.1, is signed by
    /// a throwaway CA made with `openssl` (`ca_file`), as docs/cluster.md
    /// shows.
    pub fn start_with_tls() -> Self {
        Self::start_with(true, "")
    }

    fn start_with(tls: bool, settings: &str) -> Self {
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
        let tls_port = tls.then(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port for PostgreSQL")
                .port()
        });
        let mut pg = Self {
            dir,
            bin,
            as_nobody,
            tls_port,
            options: String::new(),
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
        let mut options = format!(
            "-c unix_socket_directories='{}' -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off -c max_connections=300",
            pg.dir.path().display()
        );
        if !settings.is_empty() {
            options.push(' ');
            options.push_str(settings);
        }
        match pg.tls_port {
            None => options.push_str(" -c listen_addresses=''"),
            Some(port) => {
                pg.make_certificates();
                options.push_str(&format!(
                    " -c listen_addresses='127.0.0.1' -c port={port} -c ssl=on \
                     -c ssl_cert_file='{dir}/server.pem' -c ssl_key_file='{dir}/server.key'",
                    dir = pg.dir.path().display()
                ));
            }
        }
        pg.options = options;
        pg.start_again();
        pg
    }

    /// Starts the server again after [`Postgres::stop_immediately`], with
    /// the same settings; returns once it accepts connections.
    pub fn start_again(&self) {
        let data = self.data();
        let log = self.dir.path().join("server.log");
        let options = self.options.clone();
        self.run(
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
    }

    /// Stops the server as a crash would (`pg_ctl -m immediate`): every
    /// connection is cut, nothing is shut down cleanly.
    pub fn stop_immediately(&self) {
        let data = self.data();
        self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    /// The throwaway CA and the server's certificate and key, in the
    /// server's directory (the key readable by the server's user only).
    fn make_certificates(&self) {
        let dir = self.dir.path();
        make_certificates(dir);
        if self.as_nobody {
            for file in ["server.key", "server.pem", "ca.pem"] {
                std::os::unix::fs::chown(dir.join(file), Some(NOBODY), Some(NOBODY)).unwrap();
            }
        }
    }

    /// The CA that signed a TLS server's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The TCP address of a server started with TLS, with `params`
    /// (`sslmode=…`) appended.
    pub fn tcp_url(&self, host: &str, params: &str) -> String {
        let port = self.tls_port.expect("a server started with start_with_tls");
        format!("postgresql://taskhost@{host}:{port}/postgres?{params}")
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
        let port = self
            .tls_port
            .map(|p| format!("&port={p}"))
            .unwrap_or_default();
        format!(
            "postgresql:///postgres?host={}&user=taskhost{port}",
            self.dir.path().display()
        )
    }

    /// Runs SQL through `psql`; returns its unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> String {
        let dir = self.dir.path().to_str().unwrap().to_owned();
        let port = self.tls_port.unwrap_or(5432).to_string();
        self.run(
            "psql",
            &[
                "-h",
                &dir,
                "-p",
                &port,
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

/// A throwaway CA (`ca.pem`, `ca.key`) and a server certificate it signed
/// for `localhost` and 127.0.0.1 (`server.pem`, `server.key`, the key
/// owner-only), made with `openssl` in `dir`.
pub fn make_certificates(dir: &Path) {
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=taskhost test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
    ];
    for args in steps {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run openssl ({e}): the TLS tests need it (Debian: openssl)")
            });
        assert!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::set_permissions(
        dir.join("server.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
}
