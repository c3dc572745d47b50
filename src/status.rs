//! The `status` command: counts once from each source and prints a table a person reads at a
//! glance. It changes nothing.

use crate::admin::REQUEST_TIMEOUT;
use crate::config::Mode;
use crate::count::Count;
use crate::source::Sources;
use crate::stats::Answer;
use std::fmt::Write;

/// The report, and whether the source `run` would use could count.
pub fn report(sources: &Sources) -> (String, bool) {
    let stats = (sources.mode != Mode::Proc).then(|| sources.stats(REQUEST_TIMEOUT));
    let proc = (sources.mode != Mode::Stats).then(|| sources.proc());
    let mut out = String::new();
    if let Some(stats) = &stats {
        let _ = writeln!(out, "stats: GET {}", sources.stats_url());
        match stats {
            Ok(a) => stats_table(&mut out, a),
            Err(why) => {
                let _ = writeln!(out, "  unavailable: {why}");
            }
        }
    }
    if let Some(proc) = &proc {
        if stats.is_some() {
            out.push('\n');
        }
        let _ = writeln!(out, "proc: {}", sources.proc_names());
        match proc {
            Ok(c) => table(&mut out, "connections", c),
            Err(why) => {
                let _ = writeln!(out, "  unavailable: {why}");
            }
        }
    }
    let used = match (&stats, &proc) {
        (Some(Ok(a)), _) => Some((&a.count, "")),
        (Some(Err(_)), Some(Ok(c))) => Some((c, ", because the stats are unavailable")),
        (None, Some(Ok(c))) => Some((c, "")),
        _ => None,
    };
    match used {
        Some((c, why)) => {
            let _ = writeln!(
                out,
                "\nrun would count {} (from {}{why})",
                c.describe(),
                c.source.name()
            );
        }
        None => out.push_str("\nrun could not count anything right now\n"),
    }
    (out, used.is_some())
}

fn stats_table(out: &mut String, a: &Answer) {
    table(out, "listener", &a.count);
    for s in &a.skipped {
        let _ = writeln!(
            out,
            "  not counted: {} ({}), {} active",
            s.name, s.why, s.active
        );
    }
}

fn table(out: &mut String, heading: &str, c: &Count) {
    let width = c
        .parts
        .iter()
        .map(|p| p.name.chars().count())
        .chain([heading.len(), "total".len()])
        .max()
        .unwrap_or_default();
    let _ = writeln!(out, "  {heading:<width$}  active");
    for p in &c.parts {
        let _ = writeln!(out, "  {:<width$}  {:>6}", p.name, p.active);
    }
    let _ = writeln!(out, "  {:<width$}  {:>6}", "total", c.total);
    for w in &c.warnings {
        let _ = writeln!(out, "  warning: {w}");
    }
}
