//! The README pastes `--help` verbatim so the docs cannot drift from the flags, and names the
//! test command that CI runs.

mod support;

use support::{command, run};

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

#[test]
fn readme_holds_every_help_text_verbatim() {
    let readme = readme();
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["status", "--help"],
        &["install", "--help"],
    ] {
        let out = run(command(args));
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            readme.contains(&format!("```\n{}```", out.stdout)),
            "README.md lacks the current output of `envoy-drain {}`:\n{}",
            args.join(" "),
            out.stdout
        );
    }
}

#[test]
fn ci_runs_the_test_command_the_readme_shows() {
    let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/run")).unwrap();
    assert!(readme().contains("\nbash scripts/test\n"));
    assert!(ci.lines().any(|l| l.trim() == "bash scripts/test"), "{ci}");
}
