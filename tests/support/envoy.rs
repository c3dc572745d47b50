//! A real Envoy for the tests, started in the caller's network namespace with the Istio-like
//! bootstrap in tests/envoy/. Found through ENVOY_BIN (any version: the README's test command runs
//! the suites against 1.40.0 and 1.36.4), else 1.40.0 where `bash scripts/envoy` installs it.

use super::http::Conn;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The version used when ENVOY_BIN is not set.
pub const DEFAULT_VERSION: &str = "1.40.0";
pub const ADMIN: &str = "127.0.0.1:15000";
pub const INBOUND: &str = "127.0.0.1:15006";
pub const OUTBOUND: &str = "127.0.0.1:15001";
pub const HEALTH: &str = "127.0.0.1:15021";
pub const APP: &str = "127.0.0.1:8080";
/// Where the outbound cluster sends the app's calls out: another pod's service.
pub const UPSTREAM: &str = "127.0.0.1:9080";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The Envoy binary, or why there is none to run.
pub fn binary() -> Result<PathBuf, String> {
    let bin = std::env::var_os("ENVOY_BIN").map(PathBuf::from).unwrap_or_else(installed);
    let runs = Command::new(&bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("RELEASE"));
    if runs {
        return Ok(bin);
    }
    Err(format!(
        "no Envoy at {} (set ENVOY_BIN, or run `bash scripts/test`, which installs it)",
        bin.display()
    ))
}

/// The Envoy binary for a test, which fails loudly without one: such tests are ignored under a
/// plain `cargo test` and run by the README's test command, which installs Envoy.
pub fn required() -> PathBuf {
    binary().unwrap_or_else(|why| panic!("NOT RUN: {why}"))
}

/// Where `bash scripts/envoy` installs the binary: inside the wheel, under target/envoy-<version>.
fn installed() -> PathBuf {
    let lib = repo(&format!("target/envoy-{DEFAULT_VERSION}/lib"));
    std::fs::read_dir(&lib)
        .into_iter()
        .flatten()
        .flatten()
        .map(|python| python.path().join("site-packages/envoy/_bin/envoy"))
        .find(|bin| bin.is_file())
        .unwrap_or(lib)
}

/// Whether the admin API on `ADMIN`, in the caller's network namespace, says LIVE.
pub fn live() -> bool {
    live_at(ADMIN)
}

/// Whether the admin API on `addr` says LIVE.
fn live_at(addr: &str) -> bool {
    Conn::open(addr).and_then(|mut c| c.get("/ready")).is_ok_and(|r| r.status == 200)
}

/// Whether the admin API on the Unix socket `path` says LIVE (the answer ends with the
/// connection).
fn ready_on(path: &Path) -> bool {
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(path) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut answer = String::new();
    s.write_all(b"GET /ready HTTP/1.1\r\nhost: envoy\r\nconnection: close\r\n\r\n").is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

/// Polls `check` every 20 ms until it holds; false when `limit` passes first.
pub fn until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if check() {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    false
}

pub struct Envoy {
    child: Child,
    dir: PathBuf,
}

/// Where Envoy's admin API listens.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Admin {
    Tcp(&'static str),
    /// On a Unix socket, `Envoy::admin_socket`, as Contour's and Kuma's are.
    Unix,
}

/// How to start Envoy: how long its drain lasts, YAML files merged over the bootstrap (Envoy
/// takes one --config-yaml: their top-level keys must differ), and where its admin API listens.
pub struct EnvoyOptions {
    pub drain_time_s: u32,
    pub merge: Vec<&'static str>,
    /// YAML merged over the bootstrap too, made by the test.
    pub yaml: String,
    pub admin: Admin,
}

impl Default for EnvoyOptions {
    fn default() -> EnvoyOptions {
        EnvoyOptions {
            drain_time_s: 5,
            merge: Vec::new(),
            yaml: String::new(),
            admin: Admin::Tcp(ADMIN),
        }
    }
}

impl Envoy {
    /// Starts Envoy the way pilot-agent does (`--drain-strategy immediate`, a drain time) and
    /// waits until its admin API says LIVE.
    pub fn start(bin: &Path, opts: EnvoyOptions) -> Envoy {
        let dir = std::env::temp_dir().join(format!(
            "envoy-drain-envoy-{}-{:?}",
            std::process::id(),
            thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("envoy.log")).unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg("-c")
            .arg(repo("tests/envoy/istio-like.yaml"))
            .args(["--drain-time-s", &opts.drain_time_s.to_string()])
            .args(["--drain-strategy", "immediate", "--concurrency", "2"])
            .args(["--disable-hot-restart", "-l", "warning"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let mut yaml: String = opts
            .merge
            .iter()
            .map(|file| std::fs::read_to_string(repo(file)).unwrap() + "\n")
            .collect();
        yaml += &opts.yaml;
        match opts.admin {
            Admin::Tcp(ADMIN) => {}
            Admin::Tcp(addr) => {
                let (host, port) = addr.rsplit_once(':').unwrap();
                yaml += &format!(
                    "\nadmin: {{ address: {{ socket_address: {{ address: {host}, port_value: {port} }} }} }}\n"
                );
            }
            Admin::Unix => {
                let path = dir.join("admin.sock");
                yaml += &format!(
                    "\nadmin: {{ address: {{ pipe: {{ path: {} }} }} }}\n",
                    path.display()
                );
            }
        }
        if !yaml.is_empty() {
            cmd.args(["--config-yaml", &yaml]);
        }
        let child = cmd.spawn().expect("failed to start Envoy");
        let envoy = Envoy { child, dir };
        match opts.admin {
            Admin::Tcp(addr) => envoy.wait(Duration::from_secs(20), || live_at(addr)),
            Admin::Unix => {
                let socket = envoy.admin_socket();
                envoy.wait(Duration::from_secs(20), || ready_on(&socket));
            }
        }
        envoy
    }

    /// Where the admin API listens when it is on a Unix socket.
    pub fn admin_socket(&self) -> PathBuf {
        self.dir.join("admin.sock")
    }

    fn wait(&self, limit: Duration, live: impl FnMut() -> bool) {
        if !until(limit, live) {
            panic!("Envoy was not LIVE within {limit:?}; its log:\n{}", self.log());
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default()
    }

    /// Sends Envoy `signal`: SIGSTOP stalls it as a starved node would, SIGCONT resumes it.
    pub fn signal(&self, signal: i32) {
        // SAFETY: a signal to our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Ends Envoy at once, as a crash or an OOM kill would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
