//! What the tests run that is built once per machine outside the checkout (ztunnel, the control
//! plane): where it is.

use std::process::{Command, Stdio};

/// The directory the environment variable `env` names, else the one `script` prints: a build
/// script that builds `what` once per machine and keeps it.
pub fn built_by(env: &str, script: &str, what: &str) -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os(env) {
        return dir.into();
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("NOT RUN: {}: {e}", script.display()));
    assert!(out.status.success(), "NOT RUN: {} failed ({}): {what}", script.display(), out.status);
    String::from_utf8_lossy(&out.stdout).trim().into()
}
