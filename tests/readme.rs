//! The README pastes `--help` verbatim, and docs/usage.md every command's, so the docs cannot
//! drift from the flags; the README names the test command that CI runs.

mod support;

use support::{command, run};

fn doc(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn readme() -> String {
    doc("README.md")
}

#[test]
fn the_readme_and_docs_usage_hold_every_help_text_verbatim() {
    let usage = "docs/usage.md";
    for (file, args) in [
        ("README.md", &["--help"][..]),
        (usage, &["run", "--help"]),
        (usage, &["hold", "--help"]),
        (usage, &["status", "--help"]),
        (usage, &["install", "--help"]),
    ] {
        let out = run(command(args));
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            doc(file).contains(&format!("```\n{}```", out.stdout)),
            "{file} lacks the current output of `envoy-drain {}`:\n{}",
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
