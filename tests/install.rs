//! `install DEST` as an init container uses it: the copy is whole, executable, atomic, and
//! failures name the path and the cause.

mod support;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use support::{BIN, command, run, temp_dir};

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn installs_into_a_directory_as_an_executable_copy_and_says_so_in_one_line() {
    let dir = temp_dir("install-dir");
    let out = run(command(&["install", dir.to_str().unwrap()]));
    let installed = dir.join("envoy-drain");
    let original = std::fs::read(BIN).unwrap();
    let copy = std::fs::read(&installed).unwrap();
    let mode = std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777;
    let runs = std::process::Command::new(&installed).arg("--version").output().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(
        out.stdout,
        format!(
            "installed {} ({} bytes, envoy-drain {})\n",
            installed.display(),
            original.len(),
            env!("CARGO_PKG_VERSION")
        )
    );
    assert!(copy == original, "the copy is byte for byte the binary");
    assert_eq!(mode, 0o755);
    assert_eq!(
        String::from_utf8_lossy(&runs.stdout),
        format!("envoy-drain {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn installing_again_replaces_the_file_by_rename_and_leaves_nothing_behind() {
    let dir = temp_dir("install-twice");
    let dest = dir.join("hook");
    std::fs::write(&dest, "old binary").unwrap();
    // A process still running the old binary keeps reading the old file, whole.
    let mut old = std::fs::File::open(&dest).unwrap();
    let first = run(command(&["install", dest.to_str().unwrap()]));
    let second = run(command(&["install", dest.to_str().unwrap()]));
    let mut seen = String::new();
    old.read_to_string(&mut seen).unwrap();
    let size = std::fs::metadata(&dest).unwrap().len();
    let left = entries(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!((first.code, second.code), (Some(0), Some(0)), "{first}{second}");
    assert_eq!(seen, "old binary", "the old file was replaced, not written over");
    assert_eq!(size, std::fs::metadata(BIN).unwrap().len());
    assert_eq!(left, vec!["hook"], "no temporary file is left");
}

#[test]
fn a_destination_that_cannot_be_written_names_the_path_and_the_cause_and_exits_1() {
    let dir = temp_dir("install-bad");
    let file = dir.join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let missing = dir.join("no/such/dir/envoy-drain");
    let under_file = file.join("envoy-drain");
    let cases =
        [(missing.clone(), "no such file or directory"), (under_file.clone(), "not a directory")];
    for (dest, cause) in cases {
        let out = run(command(&["install", dest.to_str().unwrap()]));
        assert_eq!(out.code, Some(1), "{out}");
        assert!(
            out.stderr
                .starts_with(&format!("envoy-drain: failed to install to {}: ", dest.display()))
                && out.stderr.contains(cause)
                && out.stderr.lines().count() == 1,
            "{out}"
        );
    }
    let left = entries(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(left, vec!["plain-file"]);
}

#[test]
#[ignore = "needs root and unshare(1) (a PID namespace): `bash scripts/test` runs it"]
fn a_temporary_file_left_by_a_killed_install_with_the_same_pid_does_not_fail_the_next() {
    // In a container the install is always the same pid: a copy killed half-way leaves its
    // temporary file under the name the next one would take. It must install anyway, and leave
    // files that are not its own alone. A PID namespace gives the same pid here: 1.
    let dir = temp_dir("install-stale");
    let stale = dir.join(".envoy-drain.1.0.tmp");
    std::fs::write(&stale, b"half a binary").unwrap();
    let other = dir.join(".envoy-drain.4242.0.tmp");
    std::fs::write(&other, b"someone else's").unwrap();
    let mut c = std::process::Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", BIN, "install"]).arg(&dir);
    let out = run(c);
    let installed = std::fs::read(dir.join("envoy-drain")).unwrap_or_default();
    let names = entries(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(0), "needs unshare(1) and root: {out}");
    assert_eq!(installed, std::fs::read(BIN).unwrap(), "a whole copy");
    assert_eq!(
        names,
        vec![".envoy-drain.1.0.tmp", ".envoy-drain.4242.0.tmp", "envoy-drain"],
        "the others' files are left as they were"
    );
}
