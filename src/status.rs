//! The `status` command: looks at every source once and prints a table a person reads at a
//! glance: what counts, what does not and why, and what `run` would count (the same decision
//! `run` makes). It changes nothing.

use crate::admin::REQUEST_TIMEOUT;
use crate::clusters::{self, CLUSTERS_PATH};
use crate::count::{Count, NON_HTTP, SourceKind};
use crate::source::{self, Sources};
use crate::stats::{Answer, Hcm};
use std::fmt::Write;

/// The report, and whether the source `run` would use could count.
pub fn report(sources: &mut Sources) -> (String, bool) {
    let look = sources.look(REQUEST_TIMEOUT, true);
    let mut out = String::new();
    if let Some(stats) = &look.stats {
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
    if let Some(clusters) = &look.clusters {
        let _ = writeln!(out, "\nclusters: GET {}", sources.admin.url(CLUSTERS_PATH));
        match clusters {
            Ok(a) => clusters_table(&mut out, a),
            Err(why) => {
                let _ = writeln!(out, "  unavailable: {why}");
            }
        }
    }
    if let Some(proc) = &look.proc {
        if look.stats.is_some() {
            out.push('\n');
        }
        let _ = writeln!(out, "proc: {}", sources.proc_names());
        match proc {
            Ok(c) => proc_table(&mut out, c),
            Err(why) => {
                let _ = writeln!(out, "  unavailable: {why}");
            }
        }
    }
    let reading = source::decide(&look);
    match &reading.result {
        Ok(c) => {
            let why = match (c.source, &reading.fallback) {
                (SourceKind::Proc, Some(_)) => ", because the stats are unavailable",
                (SourceKind::Clusters, Some(_)) => ", because Envoy's stats do not report requests",
                (SourceKind::Stats, Some(_)) => ", because Envoy does not report requests",
                _ => "",
            };
            let _ = writeln!(
                out,
                "\nrun would count {} (from {}{why})",
                c.describe(),
                c.source.name()
            );
        }
        Err(_) => out.push_str("\nrun could not count anything right now\n"),
    }
    (out, reading.result.is_ok())
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

/// What counts, then every other socket of the table with why it does not.
fn proc_table(out: &mut String, c: &Count) {
    if let Some(basis) = &c.basis {
        let _ = writeln!(out, "  {}", basis.text);
    }
    table(out, "accepted on", c);
    if c.excluded.is_empty() {
        return;
    }
    let heading = "not counted";
    let width = c
        .excluded
        .iter()
        .map(|e| e.why.chars().count())
        .chain([heading.len()])
        .max()
        .unwrap_or_default();
    let _ = writeln!(out, "  {heading:<width$}  sockets");
    for e in &c.excluded {
        let _ = writeln!(out, "  {:<width$}  {:>7}", e.why, e.n);
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

/// Requests in flight and open connections per cluster that holds anything, then what is left
/// out and why.
fn clusters_table(out: &mut String, a: &clusters::Answer) {
    let busy = |c: &clusters::Cluster| c.requests > 0 || c.connections > 0;
    let (counted, left_out): (Vec<&clusters::Cluster>, Vec<_>) =
        a.clusters.iter().partition(|c| c.left_out.is_none());
    let shown: Vec<_> = counted.iter().filter(|c| busy(c)).collect();
    let left_rows: Vec<(String, u64)> = left_out
        .iter()
        .filter(|c| busy(c))
        .map(|c| {
            (
                format!("{} ({})", c.name, c.left_out.unwrap_or_default()),
                c.requests,
            )
        })
        .chain(a.hosts_left_out.iter().cloned())
        .collect();
    let heading = "cluster";
    let width = shown
        .iter()
        .map(|c| c.name.chars().count())
        .chain(left_rows.iter().map(|(n, _)| n.chars().count()))
        .chain(["not counted".len()])
        .max()
        .unwrap_or_default();
    let _ = writeln!(out, "  {heading:<width$}  requests  connections");
    for c in &shown {
        let _ = writeln!(
            out,
            "  {:<width$}  {:>8}  {:>11}",
            c.name, c.requests, c.connections
        );
    }
    let _ = writeln!(out, "  {:<width$}  {:>8}", "total", a.count.total);
    let quiet = a.quiet;
    if quiet > 0 {
        let plural = if quiet == 1 { "" } else { "s" };
        let _ = writeln!(out, "  and {quiet} more cluster{plural} with nothing open");
    }
    if !left_rows.is_empty() {
        let _ = writeln!(out, "  {:<width$}  requests", "not counted");
        for (name, n) in left_rows {
            let _ = writeln!(out, "  {name:<width$}  {n:>8}");
        }
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
