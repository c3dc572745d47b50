//! `install DEST`: copies the running binary into a shared volume, for an init container of the
//! FROM scratch image. Atomic: a temporary file beside DEST, flushed, then renamed over it.

use crate::cli::InstallArgs;
use crate::error::{Failure, failed, io_cause};
use crate::outcome::{EXIT_INSTALL_FAILED, EXIT_REACHED};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

/// Installs to `dest`, or `dest/envoy-drain` when it is a directory; returns the path and size
/// written.
fn install(dest: &Path) -> Result<(PathBuf, u64), Failure> {
    let (mut source, from) = open_self()?;
    let target = if dest.is_dir() { dest.join("envoy-drain") } else { dest.to_path_buf() };
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    let fail = |step: String| failed("install to", target.display(), step);
    // Pid and time: a killed install's file (a container's pid repeats) is not ours to touch.
    let nanos = std::time::UNIX_EPOCH.elapsed().unwrap_or_default().as_nanos();
    let temp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let mut out =
        OpenOptions::new().write(true).create_new(true).mode(0o700).open(&temp).map_err(|e| {
            fail(format!("cannot create a temporary file in {}: {}", dir.display(), io_cause(&e)))
        })?;
    // From here on the temporary file is ours, and the only one a failure removes.
    let fail = |step: String| {
        let _ = fs::remove_file(&temp);
        fail(step)
    };
    let written = copy_to(&mut source, &mut out).map_err(|e| {
        fail(format!("cannot write {} from {}: {}", temp.display(), from.display(), io_cause(&e)))
    })?;
    fs::rename(&temp, &target)
        .map_err(|e| fail(format!("cannot rename {} to it: {}", temp.display(), io_cause(&e))))?;
    // The rename is durable once the directory is flushed; a failure here changes nothing visible.
    let _ = File::open(dir).and_then(|d| d.sync_all());
    Ok((target, written))
}

/// The running binary: /proc/self/exe, or argv[0] where /proc is not mounted.
fn open_self() -> Result<(File, PathBuf), Failure> {
    let exe = PathBuf::from("/proc/self/exe");
    let proc_err = match File::open(&exe) {
        Ok(f) => return Ok((f, exe)),
        Err(e) => io_cause(&e),
    };
    match std::env::args_os().next().map(PathBuf::from).filter(|p| p.components().count() > 1) {
        Some(p) => File::open(&p)
            .map(|f| (f, p.clone()))
            .map_err(|e| failed("open", p.display(), io_cause(&e))),
        None => {
            Err(failed("open", exe.display(), format!("{proc_err} (and argv[0] is not a path)")))
        }
    }
}

fn copy_to(source: &mut File, out: &mut File) -> io::Result<u64> {
    let n = io::copy(source, out)?;
    out.flush()?;
    out.sync_all()?;
    // Set after writing, and explicitly: the umask must not decide who may run the hook.
    out.set_permissions(fs::Permissions::from_mode(0o755))?;
    Ok(n)
}
