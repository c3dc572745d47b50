//! The `status` command: counts once from each source and prints a table a person reads at a
//! glance. It changes nothing.

use crate::admin::REQUEST_TIMEOUT;
use crate::config::Mode;
use crate::count::{Count, NON_HTTP, Unit};
use crate::source::Sources;
use crate::stats::{Answer, Hcm};
use std::fmt::Write;

/// What the stats said: connections, and with `--count requests` requests too.
struct Stats {
    connections: Result<Answer, String>,
    requests: Option<Result<(Answer, Vec<Hcm>), String>>,
}

/// The report, and whether the source `run` would use could count.
pub fn report(sources: &Sources) -> (String, bool) {
    let stats = (sources.mode != Mode::Proc).then(|| match sources.stats_body(REQUEST_TIMEOUT) {
        Ok(body) => Stats {
            connections: sources.connections(&body),
            requests: (sources.unit == Unit::Requests).then(|| sources.requests(&body)),
        },
        Err(why) => Stats {
            connections: Err(why.clone()),
            requests: (sources.unit == Unit::Requests).then_some(Err(why)),
        },
    });
    let proc = (sources.mode != Mode::Stats).then(|| sources.proc());
    let mut out = String::new();
    if let Some(stats) = &stats {
        let _ = writeln!(out, "stats: GET {}", sources.stats_url());
        match &stats.connections {
            Ok(a) => stats_table(&mut out, a),
            Err(why) => {
                let _ = writeln!(out, "  unavailable: {why}");
            }
        }
        match &stats.requests {
            Some(Ok((a, hcms))) => requests_table(&mut out, &a.count, hcms),
            Some(Err(why)) if stats.connections.is_ok() => {
                let _ = writeln!(out, "  requests unavailable: {why}");
            }
            _ => {}
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
    let from_stats = stats
        .as_ref()
        .and_then(|s| match (&s.requests, &s.connections) {
            (Some(Ok((a, _))), _) => Some((&a.count, "")),
            (Some(Err(_)), Ok(a)) => Some((&a.count, ", because Envoy does not report requests")),
            (None, Ok(a)) => Some((&a.count, "")),
            _ => None,
        });
    let used = match (from_stats, &proc) {
        (Some(used), _) => Some(used),
        (None, Some(Ok(c))) if stats.is_some() => Some((c, ", because the stats are unavailable")),
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

/// Requests and connections side by side per HTTP connection manager, then what has no HTTP.
fn requests_table(out: &mut String, c: &Count, hcms: &[Hcm]) {
    let heading = "HTTP connection manager";
    let width = hcms
        .iter()
        .map(|h| h.prefix.chars().count())
        .chain([heading.len(), NON_HTTP.len()])
        .max()
        .unwrap_or_default();
    let _ = writeln!(out, "\n  {heading:<width$}  requests  connections");
    for h in hcms {
        let _ = writeln!(
            out,
            "  {:<width$}  {:>8}  {:>11}",
            h.prefix, h.requests, h.connections
        );
    }
    let tcp = c
        .parts
        .iter()
        .find(|p| p.name == NON_HTTP)
        .map_or(0, |p| p.active);
    let _ = writeln!(out, "  {NON_HTTP:<width$}  {:>8}  {tcp:>11}", "-");
}
