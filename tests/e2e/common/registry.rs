//! A throwaway OCI registry for the `oci` tests: Debian's
//! `docker-registry` (the CNCF distribution server) in a temporary
//! directory, on 127.0.0.1 with TLS from a throwaway CA and basic auth
//! from an htpasswd file (`htpasswd -B`, Debian's `apache2-utils`).
//! Stopped on drop. When it cannot start, the test fails with the
//! reason: these tests never skip.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::postgres::make_certificates;

/// The user the registry accepts.
pub const USER: &str = "alice";
/// Her password.
pub const PASSWORD: &str = "s3cret-registry";

pub struct Registry {
    dir: tempfile::TempDir,
    child: Option<Child>,
    port: u16,
}

fn tool(name: &str, package: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    assert!(
        path.is_file(),
        "{} is not installed: the OCI tests start a real registry (Debian: apt-get install \
         {package}; `cargo xtask test` installs it)",
        path.display()
    );
    path
}

impl Registry {
    /// Starts one and waits until it accepts connections.
    pub fn start() -> Self {
        let registry = tool("docker-registry", "docker-registry");
        let htpasswd = tool("htpasswd", "apache2-utils");
        let dir = tempfile::tempdir().unwrap();
        make_certificates(dir.path());
        let out = Command::new(htpasswd)
            .args(["-Bbn", USER, PASSWORD])
            .output()
            .expect("run htpasswd");
        assert!(out.status.success(), "htpasswd: {out:?}");
        std::fs::write(dir.path().join("htpasswd"), &out.stdout).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let at = |name: &str| dir.path().join(name).display().to_string();
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: throwaway\n  tls:\n    certificate: {}\n\
             \x20   key: {}\nauth:\n  htpasswd:\n    realm: taskhost-tests\n    path: {}\n",
            at("data"),
            at("server.pem"),
            at("server.key"),
            at("htpasswd"),
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(registry)
            .args(["serve", &at("config.yml")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn docker-registry");
        let mut registry = Registry {
            dir,
            child: Some(child),
            port,
        };
        registry.wait_until_up();
        registry
    }

    fn wait_until_up(&mut self) {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            let child = self.child.as_mut().unwrap();
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "the registry exited ({status}) before it listened: {}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < until,
                "the registry did not listen within 30 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// `oci://127.0.0.1:PORT/REPOSITORY_AND_TAG`.
    pub fn url(&self, rest: &str) -> String {
        format!("oci://127.0.0.1:{}/{rest}", self.port)
    }

    /// The CA that signed its certificate.
    pub fn ca_file(&self) -> String {
        self.dir.path().join("ca.pem").display().to_string()
    }

    /// Where it keeps the bytes of a blob (`sha256:HEX`).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Stops it (a registry that is down).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}
