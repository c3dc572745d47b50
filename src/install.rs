//! `install DEST`: copies the running binary into a shared volume, for an init container running
//! the FROM scratch image (no shell, no cp). Atomic: a temporary file in the same directory,
//! flushed, made executable, then renamed over DEST, so a half-written binary is never visible.

use crate::cli::InstallArgs;
use crate::error::{Failure, io_cause};
use crate::outcome::{EXIT_INSTALL_FAILED, EXIT_REACHED};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const BINARY_NAME: &str = "envoy-drain";

/// Where the copy goes: `DEST/envoy-drain` when DEST is a directory, else DEST itself.
fn target(dest: &Path) -> PathBuf {
    if dest.is_dir() { dest.join(BINARY_NAME) } else { dest.to_path_buf() }
}

/// The command: one line on stdout (path, size, version), or the failure on stderr.
pub fn command(args: &InstallArgs) -> i32 {
    match install(Path::new(&args.dest)) {
        Ok((path, size)) => {
            let _ = writeln!(io::stdout(), "{}", crate::text::installed(&path, size));
            EXIT_REACHED
        }
        Err(e) => {
            let _ = writeln!(io::stderr(), "envoy-drain: {e}");
            EXIT_INSTALL_FAILED
        }
    }
}

/// Installs and returns the path and size written.
fn install(dest: &Path) -> Result<(PathBuf, u64), Failure> {
    let (mut source, from) = open_self()?;
    let target = target(dest);
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| BINARY_NAME.to_string());
    let failed = |step: String| Failure::new("install to", target.display().to_string(), step);
    let (temp, mut out) = create_temp(&dir, &name).map_err(|e| {
        failed(format!("cannot create a temporary file in {}: {}", dir.display(), io_cause(&e)))
    })?;
    // From here on the temporary file is ours, and the only one a failure removes.
    let failed = |step: String| {
        let _ = fs::remove_file(&temp);
        failed(step)
    };
    let written = copy_to(&mut source, &mut out).map_err(|e| {
        failed(format!("cannot write {} from {}: {}", temp.display(), from.display(), io_cause(&e)))
    })?;
    fs::rename(&temp, &target)
        .map_err(|e| failed(format!("cannot rename {} to it: {}", temp.display(), io_cause(&e))))?;
    // The rename is durable once the directory is flushed; a failure here changes nothing visible.
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok((target, written))
}

/// The running binary: /proc/self/exe, or argv[0] where /proc is not mounted.
fn open_self() -> Result<(File, PathBuf), Failure> {
    let proc_exe = PathBuf::from("/proc/self/exe");
    match File::open(&proc_exe) {
        Ok(f) => Ok((f, proc_exe)),
        Err(proc_err) => {
            let argv0 = std::env::args_os().next().map(PathBuf::from);
            match argv0.filter(|p| p.components().count() > 1) {
                Some(p) => File::open(&p)
                    .map(|f| (f, p.clone()))
                    .map_err(|e| Failure::new("open", p.display().to_string(), io_cause(&e))),
                None => Err(Failure::new(
                    "open",
                    proc_exe.display().to_string(),
                    format!("{} (and argv[0] is not a path)", io_cause(&proc_err)),
                )),
            }
        }
    }
}

/// A new file beside the target, named after it and this process. A killed install can leave one
/// behind with the same name (a container's pid repeats): that one is not ours, so another name
/// is tried, and it is left alone.
fn create_temp(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
    let mut last = io::Error::from(io::ErrorKind::AlreadyExists);
    for n in 0..100 {
        let temp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).mode(0o700).open(&temp) {
            Ok(f) => return Ok((temp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

fn copy_to(source: &mut File, out: &mut File) -> io::Result<u64> {
    let n = io::copy(source, out)?;
    out.flush()?;
    out.sync_all()?;
    // Set after writing, and explicitly: the umask must not decide who may run the hook.
    out.set_permissions(fs::Permissions::from_mode(0o755))?;
    Ok(n)
}
