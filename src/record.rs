//! One record per termination: with `--log-format json`, the summary line's members beside its
//! `msg`, so that a log collector can read what each hook did without parsing sentences. The
//! names are stable; docs/usage.md ("The record") lists them.

use crate::config::{Holding, HookConfig, Plan};
use crate::error::Failure;
use crate::log::json_string;
use crate::outcome::{Outcome, Progress, signal_name};
use std::fmt::Write;
use std::time::Duration;

/// The most bytes of one warning or error the record holds, and of all its warnings together: the
/// record and the summary's message share one line of at most 4096 bytes (log.rs).
const WORDS: usize = 160;
const WARNINGS: usize = 1000;

/// Where the pod's namespace is, when no variable names it: the service account's mount.
const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Who ran: the pod's name (`POD_NAME`, which Istio's injection sets, else its hostname, which the
/// kubelet sets to it cut to 63 characters, or to `spec.hostname`) and namespace
/// (`POD_NAMESPACE`, which Istio's injection sets, else the service account's mount).
pub(crate) struct Identity {
    pub(crate) pod: Option<String>,
    pub(crate) namespace: Option<String>,
}

impl Identity {
    pub(crate) fn of_this_pod(env: &crate::config::Env<'_>) -> Identity {
        let mut name = [0u8; 256];
        // SAFETY: gethostname writes at most the buffer's length into a buffer we own.
        let ok = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0;
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let pod = env("POD_NAME")
            .or_else(|| ok.then(|| String::from_utf8_lossy(&name[..end]).into_owned()));
        let namespace = env("POD_NAMESPACE")
            .or_else(|| std::fs::read_to_string(NAMESPACE_FILE).ok())
            .map(|n| n.trim().to_string());
        let known = |s: Option<String>| s.filter(|s| !s.is_empty());
        Identity { pod: known(pod), namespace: known(namespace) }
    }
}

/// What one run did, as JSON members (`,"name":value...`) to follow the summary's `msg`; with
/// the log lines that could not be written, and the warnings said.
pub(crate) fn members(
    (o, elapsed): (Outcome, Duration),
    (cfg, p, who): (&HookConfig, &Progress, &Identity),
    (dropped, warnings): (u64, &[String]),
) -> String {
    let hold = matches!(cfg.rules.plan, Plan::Hold(_));
    let mut m = String::new();
    let mut add = |name: &str, value: String| {
        let _ = write!(m, ",\"{name}\":{value}");
    };
    let text = |s: Option<&str>| s.map_or("null".to_string(), json_string);
    // Milliseconds, whole: exact, and no float formatting in the binary.
    let ms = |d: Duration| d.as_millis().to_string();
    add("event", json_string("summary"));
    add("version", json_string(env!("CARGO_PKG_VERSION")));
    add("pod", text(who.pod.as_deref()));
    add("namespace", text(who.namespace.as_deref()));
    add("command", json_string(if hold { "hold" } else { "run" }));
    add("preset", json_string(preset(cfg)));
    add("outcome", json_string(&outcome(o)));
    add("exit_code", o.exit_code().to_string());
    add("elapsed_ms", ms(elapsed));
    add("deadline_ms", ms(cfg.rules.deadline));
    // The setting, as the deadline cut it (counted from the start, not from the drain's answer).
    add("min_ms", ms(crate::wait::drain_done(&cfg.rules, Duration::ZERO)));
    let quiet = p.pace.map_or(cfg.rules.settle, |pace| pace.quiet);
    add("quiet_ms", if hold { ms(quiet) } else { "null".into() });
    let last = p.arrived_at.map(|t| elapsed.saturating_sub(t));
    add("since_last_arrival_ms", last.map_or("null".into(), ms));
    add("count", p.last.as_ref().map_or("null".into(), |c| c.total.to_string()));
    let unit = p.last.as_ref().map(|c| format!("{:?}", c.unit).to_ascii_lowercase());
    add("count_unit", text(unit.as_deref()));
    let source = p.last.as_ref().map(|c| c.source.to_string());
    add("count_source", text(source.as_deref()));
    let failed = p.unknown.as_ref().map(Failure::to_string);
    let failed = failed.as_deref().map(|f| &f[..f.floor_char_boundary(WORDS)]);
    add("count_failed", text(failed));
    // As many as fit in `WARNINGS`, so that the summary's message keeps its room in the line.
    let mut kept = Vec::new();
    for w in warnings.iter().map(|w| json_string(&w[..w.floor_char_boundary(WORDS)])) {
        if kept.iter().map(String::len).sum::<usize>() + w.len() > WARNINGS {
            break;
        }
        kept.push(w);
    }
    add("warnings", format!("[{}]", kept.join(",")));
    add("dropped_lines", dropped.to_string());
    m
}

/// The preset as `--preset` names it: `hold`'s ambient and none, else the sidecar's.
fn preset(cfg: &HookConfig) -> &'static str {
    match &cfg.rules.plan {
        Plan::Hold(h) if h.holding == Holding::Ambient => "ambient",
        Plan::Hold(h) if h.holding == Holding::NoMesh => "none",
        Plan::Run { .. } | Plan::Hold(_) => cfg.counting.preset.name,
    }
}

/// Why it ended, in one stable word (a signal's: `sigterm`, `sighup`...).
fn outcome(o: Outcome) -> String {
    match o {
        Outcome::Reached => "reached",
        Outcome::AppExited => "app_exited",
        Outcome::KeptAlive(_) => "kept_alive",
        Outcome::Deadline => "deadline",
        Outcome::NothingCounted => "nothing_counted",
        Outcome::NotEnvoy => "not_envoy",
        Outcome::Interrupted(sig) => return signal_name(sig).to_ascii_lowercase(),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::HoldArgs;
    use crate::hold::config::hold_config;

    #[test]
    fn a_hold_that_went_quiet_is_one_record_with_every_member() {
        let args = HoldArgs { preset: Some("none".into()), ..HoldArgs::default() };
        let cfg = hold_config(&args, &|_| None).expect("a hold's config");
        let progress =
            Progress { arrived_at: Some(Duration::from_millis(4500)), ..Progress::default() };
        let who = Identity { pod: Some("app-7d9f-x2x8q".into()), namespace: None };
        let warnings = ["UDP is served on port 5353 \"x\"".to_string()];
        let got = members(
            (Outcome::Reached, Duration::from_millis(5200)),
            (&cfg, &progress, &who),
            (0, &warnings),
        );
        assert_eq!(
            got,
            ",\"event\":\"summary\",\"version\":\"0.1.0\",\"pod\":\"app-7d9f-x2x8q\",\
             \"namespace\":null,\"command\":\"hold\",\"preset\":\"none\",\"outcome\":\"reached\",\
             \"exit_code\":0,\"elapsed_ms\":5200,\"deadline_ms\":20000,\"min_ms\":3000,\
             \"quiet_ms\":500,\"since_last_arrival_ms\":700,\"count\":null,\"count_unit\":null,\
             \"count_source\":null,\"count_failed\":null,\
             \"warnings\":[\"UDP is served on port 5353 \\\"x\\\"\"],\"dropped_lines\":0"
        );
    }

    #[test]
    fn long_warnings_are_cut_and_dropped_so_that_the_record_leaves_the_message_its_room() {
        // A pod author's 35 KB annotation repeated in every warning (a red-team's).
        let args = HoldArgs { preset: Some("none".into()), ..HoldArgs::default() };
        let cfg = hold_config(&args, &|_| None).expect("a hold's config");
        let progress =
            Progress { unknown: Some(Failure::from("é".repeat(20_000))), ..Progress::default() };
        let who = Identity { pod: None, namespace: None };
        let warnings = vec![format!("ignoring annotation {}", "\u{7}é".repeat(10_000)); 16];
        let got = members(
            (Outcome::Deadline, Duration::from_secs(2)),
            (&cfg, &progress, &who),
            (0, &warnings),
        );
        assert!(got.len() < 2000, "{}", got.len());
        let line = crate::log::json_line(
            std::time::SystemTime::UNIX_EPOCH,
            crate::log::Level::Warn,
            &"x".repeat(100_000),
            &got,
        );
        assert!(line.len() <= 4096 && line.contains("\"msg\":\"xxx"), "{}", line.len());
    }

    #[test]
    fn the_pod_is_pod_name_else_the_hostname_and_min_ms_the_min_the_deadline_kept() {
        // Red-team of run, findings 5 and 8: the kubelet cuts a pod's hostname to 63 characters
        // (and `spec.hostname` replaces it), where Istio gives istio-proxy POD_NAME; a min-drain
        // of 3 s against a deadline of 3 s waits 2.5 s, which the record said was 3,000 ms.
        let long = "checkout-service-canary-7d9f8c6b5a-x2x8q-with-a-name-longer-than-63-chars";
        let who = Identity::of_this_pod(&|k| (k == "POD_NAME").then(|| long.to_string()));
        assert_eq!(who.pod.as_deref(), Some(long));
        assert!(Identity::of_this_pod(&|_| None).pod.is_some_and(|p| !p.is_empty()), "the host's");
        let args = HoldArgs {
            preset: Some("none".into()),
            deadline: Some("3s".into()),
            ..HoldArgs::default()
        };
        let cfg = hold_config(&args, &|_| None).expect("a hold's config");
        let got = members(
            (Outcome::Reached, Duration::from_millis(2500)),
            (&cfg, &Progress::default(), &who),
            (0, &[]),
        );
        assert!(got.contains(",\"deadline_ms\":3000,\"min_ms\":2500,"));
    }

    #[test]
    fn every_outcome_has_its_word_and_its_exit_code() {
        for (o, word, code) in [
            (Outcome::Reached, "reached", 0),
            (Outcome::AppExited, "app_exited", 0),
            (Outcome::KeptAlive(Duration::ZERO), "kept_alive", 0),
            (Outcome::Deadline, "deadline", 1),
            (Outcome::NothingCounted, "nothing_counted", 3),
            (Outcome::NotEnvoy, "not_envoy", 3),
            (Outcome::Interrupted(libc::SIGINT), "sigint", 130),
            (Outcome::Interrupted(libc::SIGTERM), "sigterm", 143),
            (Outcome::Interrupted(libc::SIGHUP), "sighup", 129),
        ] {
            assert_eq!((outcome(o).as_str(), o.exit_code()), (word, code));
        }
    }
}
