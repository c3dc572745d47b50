//! The rollout table: three pods ended under 100 requests a second on a real node (kubelet,
//! containerd, runc, kube-proxy; with sidecars istiod and pilot-agent; in ambient mode istiod,
//! ztunnel and istio-cni; tests/support/rollout.rs), one row per data plane x app shutdown x
//! clients x operation. Arguments narrow it down: data planes (`no-mesh`, `classic`, `native`,
//! `ambient`; `waypoint`, an ambient waypoint restarted instead of the app), shutdowns (`none`,
//! `exit-on-zero`, `sleep15` or any `sleep<seconds>`, `envoy-drain`), clients (`new-conn`,
//! `keep-alive`, `downloads`: kept-alive requests and four slow readers of 3 MB answers), the ways
//! the pods end (`restart`: `kubectl rollout restart` with the Deployment's defaults, the only one
//! when none is given; `restart-surge`: maxSurge 25 %, maxUnavailable 0; `restart-one`: maxSurge 0,
//! maxUnavailable 1; `drain`: `kubectl drain node-2`; `scale=<n>`: `kubectl scale` to n;
//! `delete=<n>`: `kubectl delete pod` of n pods); several of one sort are all run. And for every
//! row: `debounce=<seconds>` (istiod's push held back that long), `replicas=<n>` (3, or 6 on
//! several nodes), `rate=<requests a second>` (100), `request-ms=<ms>` (the app's time for each
//! answer, 50), `grace=<seconds>` (the pods' terminationGracePeriodSeconds, 30), `nodes=<1 to 3>`
//! (1; with more, the client on node-1, the app's pods spread over the others under a
//! PodDisruptionBudget), `min-available=<pods or percent%>` or `max-unavailable=<pods or
//! percent%>` (the budget's one field: minAvailable 50% unless named). `demo` alone:
//! the demo's four rows side by side in one cluster, restarted at once (native sidecars and
//! ambient mode, each as written and with envoy-drain). Run it with
//! `bash examples/rollout.sh [ARG...]`, as root.

#[allow(dead_code)]
#[path = "../tests/support"]
mod support {
    pub mod built;
    pub mod cluster;
    pub mod data_plane;
    pub mod envoy;
    pub mod h2;
    pub mod http;
    pub mod netns;
    pub mod node;
    pub mod rollout;
}

use std::time::Duration;
use support::rollout::{
    Amount, Budget, Case, Clients, DataPlane, Operation, Row, Shutdown, Strategy, run, run_together,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args == ["demo"] {
        return demo();
    }
    let mut a = Args::default();
    for arg in args {
        if let Err(other) = a.take(&arg) {
            eprintln!(
                "rollout: {other:?}: expected no-mesh, classic, native, ambient, waypoint, none, \
                 exit-on-zero, sleep<seconds>, envoy-drain, new-conn, keep-alive, downloads, \
                 debounce=<seconds>, replicas=<n>, rate=<requests a second>, \
                 request-ms=<the app's answer time>, nodes=<1 to 3>, grace=<seconds>, \
                 restart, restart-surge, restart-one, drain, scale=<replicas>, delete=<pods>, \
                 min-available=<n or n%>, max-unavailable=<n or n%>, or demo alone"
            );
            std::process::exit(2);
        }
    }
    a.defaults();
    if let Some(why) = a.conflict() {
        eprintln!("rollout: {why}");
        std::process::exit(2);
    }
    a.header();
    for &mesh in &a.meshes {
        for &shutdown in &a.shutdowns {
            // Without a sidecar there is no proxy in the pod to exit on zero connections.
            if matches!(mesh, DataPlane::None | DataPlane::Ambient)
                && shutdown == Shutdown::ExitOnZero
            {
                continue;
            }
            // A waypoint's rows restart the waypoint: the app's preStop plays no part.
            if mesh == DataPlane::Waypoint && matches!(shutdown, Shutdown::Sleep(_)) {
                continue;
            }
            for (&clients, &operation) in
                a.clients.iter().flat_map(|c| a.operations.iter().map(move |o| (c, o)))
            {
                let case = Case {
                    debounce: a.debounce,
                    replicas: a.replicas,
                    rate: a.rate,
                    grace: a.grace,
                    request_ms: a.request_ms,
                    nodes: a.nodes,
                    operation,
                    budget: a.budget,
                    ..Case::new(mesh, shutdown, clients)
                };
                let row = run(case);
                println!("{}", table_row(&row));
                for (_, summary) in &row.holds {
                    eprintln!("{case:?}: {summary}");
                }
                if !row.started.is_empty() {
                    let s = |t: Option<i64>| t.map_or("-".into(), |t| format!("{t}s"));
                    let each: Vec<String> =
                        row.started.iter().map(|(r, i)| format!("{} ({})", s(*r), s(*i))).collect();
                    eprintln!(
                        "{case:?}: new pods, creation to Ready (envoy-drain's install container): {}",
                        each.join(" ")
                    );
                }
            }
        }
    }
}

/// What the arguments chose: the rows (each list every value where none was named) and the
/// rollout's settings.
struct Args {
    meshes: Vec<DataPlane>,
    shutdowns: Vec<Shutdown>,
    clients: Vec<Clients>,
    operations: Vec<Operation>,
    debounce: Option<Duration>,
    replicas: u32,
    rate: u32,
    grace: u32,
    request_ms: u32,
    nodes: u8,
    budget: Budget,
}

impl Default for Args {
    fn default() -> Args {
        let (meshes, shutdowns, clients) = (Vec::new(), Vec::new(), Vec::new());
        // No replicas given: 3, or 6 on several nodes (three a node).
        let (replicas, rate, grace, request_ms) = (0, 100, 30, 50);
        let (debounce, nodes, operations) = (None, 1, Vec::new());
        let budget = Budget::MinAvailable(Amount::Percent(50));
        Args {
            meshes,
            shutdowns,
            clients,
            operations,
            debounce,
            replicas,
            rate,
            grace,
            request_ms,
            nodes,
            budget,
        }
    }
}

impl Args {
    /// One argument, or the argument back where it is none of them.
    fn take(&mut self, a: &str) -> Result<(), String> {
        let number = |key: &str| a.strip_prefix(key).and_then(|n| n.parse::<u32>().ok());
        match a {
            "no-mesh" => self.meshes.push(DataPlane::None),
            "classic" => self.meshes.push(DataPlane::Sidecar { native: false }),
            "native" => self.meshes.push(DataPlane::Sidecar { native: true }),
            "ambient" => self.meshes.push(DataPlane::Ambient),
            "waypoint" => self.meshes.push(DataPlane::Waypoint),
            "none" => self.shutdowns.push(Shutdown::None),
            "exit-on-zero" => self.shutdowns.push(Shutdown::ExitOnZero),
            "envoy-drain" => self.shutdowns.push(Shutdown::EnvoyDrain),
            "new-conn" => self.clients.push(Clients::NewConn),
            "keep-alive" => self.clients.push(Clients::KeepAlive),
            "downloads" => self.clients.push(Clients::Downloads),
            "restart" => self.operations.push(Operation::Restart(Strategy::Default)),
            "restart-surge" => self.operations.push(Operation::Restart(Strategy::Surge)),
            "restart-one" => self.operations.push(Operation::Restart(Strategy::OneAtATime)),
            "drain" => self.operations.push(Operation::Drain),
            _ => match [
                "sleep",
                "debounce=",
                "replicas=",
                "rate=",
                "grace=",
                "request-ms=",
                "nodes=",
                "scale=",
                "delete=",
            ]
            .into_iter()
            .find_map(|key| Some((key, number(key)?)))
            {
                Some(("sleep", s)) if s > 0 => self.shutdowns.push(Shutdown::Sleep(s)),
                Some(("debounce=", s)) => self.debounce = Some(Duration::from_secs(s.into())),
                Some(("replicas=", n)) if n > 0 => self.replicas = n,
                Some(("rate=", n)) if n > 0 => self.rate = n,
                Some(("grace=", s)) => self.grace = s,
                Some(("request-ms=", n)) if n > 0 => self.request_ms = n,
                Some(("nodes=", n)) if (1..=3).contains(&n) => self.nodes = n as u8,
                Some(("scale=", n)) if n > 0 => self.operations.push(Operation::Scale(n)),
                Some(("delete=", n)) if n > 0 => self.operations.push(Operation::Delete(n)),
                _ => match amount(a, "min-available=")
                    .map(Budget::MinAvailable)
                    .or_else(|| amount(a, "max-unavailable=").map(Budget::MaxUnavailable))
                {
                    Some(budget) => self.budget = budget,
                    None => return Err(a.to_string()),
                },
            },
        }
        Ok(())
    }

    fn defaults(&mut self) {
        if self.meshes.is_empty() {
            self.meshes = vec![
                DataPlane::None,
                DataPlane::Sidecar { native: false },
                DataPlane::Sidecar { native: true },
                DataPlane::Ambient,
            ];
        }
        if self.shutdowns.is_empty() {
            self.shutdowns = vec![
                Shutdown::None,
                Shutdown::ExitOnZero,
                Shutdown::Sleep(15),
                Shutdown::EnvoyDrain,
            ];
        }
        if self.clients.is_empty() {
            self.clients = vec![Clients::NewConn, Clients::KeepAlive];
        }
        if self.operations.is_empty() {
            self.operations = vec![Operation::Restart(Strategy::Default)];
        }
        if self.replicas == 0 {
            self.replicas = if self.nodes > 1 { 6 } else { 3 };
        }
    }

    /// Arguments that cannot go together, said as the usage error.
    fn conflict(&self) -> Option<String> {
        let restarts = self.operations.iter().all(|o| matches!(o, Operation::Restart(_)));
        let replicas = self.replicas;
        let why = self.operations.iter().find_map(|o| match *o {
            Operation::Drain if self.nodes < 3 => {
                Some("drain: expected nodes=3 (node-1 holds the client, node-2's pods move to node-3)")
            }
            Operation::Drain if replicas < 2 => {
                Some("drain: expected replicas=2 or more (node-2 holding one)")
            }
            Operation::Drain if self.budget.allowed(replicas) == 0 => {
                Some("drain: expected a budget that allows an eviction (kubectl would retry to its timeout)")
            }
            Operation::Scale(n) if n >= replicas => Some("scale=<n>: expected fewer than the replicas"),
            Operation::Delete(n) if n > replicas => Some("delete=<n>: expected at most the replicas"),
            _ => None,
        });
        let drains = self.operations.contains(&Operation::Drain);
        let budget = if drains { format!(", {}", self.budget) } else { String::new() };
        match why {
            Some(why) => Some(format!("{why}; here replicas={replicas}{budget}")),
            None if self.meshes.contains(&DataPlane::Waypoint) && !restarts => {
                Some("waypoint: expected a restart alone (its rows restart the waypoint)".into())
            }
            None => None,
        }
    }

    /// The settings, and the table's head.
    fn header(&self) {
        println!(
            "{} replicas on {} node(s), {} requests a second of {} ms each, the app's grace period {} s (a \
             waypoint's: examples/waypoint.yaml's 60 s with envoy-drain, else istiod's 30 s), \
             istiod's debounce {}{}\n",
            self.replicas,
            self.nodes,
            self.rate,
            self.request_ms,
            self.grace,
            self.debounce.map_or("its default".to_string(), |d| format!("{d:?}")),
            match self.nodes {
                1 => String::new(),
                _ => format!(", the app's PodDisruptionBudget {}", self.budget),
            }
        );
        println!(
            "| data plane | shutdown | clients | operation | answered 200 | failed | what failed | took (to the last pod it ended gone) | endpoint out of the data path after deletion | each ended pod's hold end after its last request |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
    }
}

/// `min-available=3` or `max-unavailable=25%`: a budget's amount after `key`, a percentage at
/// most 100.
fn amount(a: &str, key: &str) -> Option<Amount> {
    let n = a.strip_prefix(key)?;
    match n.strip_suffix('%') {
        Some(p) => p.parse().ok().filter(|p| *p <= 100).map(Amount::Percent),
        None => n.parse().ok().map(Amount::Pods),
    }
}

/// A row of the table, markdown.
fn table_row(row: &Row) -> String {
    let case = row.case;
    let what: Vec<String> = row.failed.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let seconds = |s: &[Option<f64>]| {
        let s: Vec<String> =
            s.iter().map(|a| a.map_or("-".into(), |a| format!("{a:.1}s"))).collect();
        s.join(" ")
    };
    let holds: Vec<Option<f64>> = row.holds.iter().map(|(a, _)| *a).collect();
    let refused = match row.refused {
        0 => String::new(),
        1 => " (1 eviction refused, 429)".to_string(),
        n => format!(" ({n} evictions refused, 429)"),
    };
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {:.1}s{refused} | {} | {} |",
        case.mesh_name(),
        case.shutdown_name(),
        case.clients_name(),
        case.operation_name(),
        match case.clients {
            Clients::Downloads => format!("{} ({} downloads)", row.ok, row.downloaded),
            _ => row.ok.to_string(),
        },
        row.failed_total(),
        if what.is_empty() { "-".to_string() } else { what.join(", ") },
        row.took.as_secs_f64(),
        seconds(&row.propagation),
        seconds(&holds),
    )
}

/// The demo: native sidecars and ambient mode side by side, each as written and with envoy-drain,
/// two pods each (four rollouts of three outgrow two minutes on two cores), restarted at once
/// under 100 requests a second each (a connection per request), istiod pushing each change 2 s
/// late (PILOT_DEBOUNCE_AFTER), as a busy one does.
fn demo() {
    let debounce = Some(Duration::from_secs(2));
    let cases: Vec<Case> = [DataPlane::Sidecar { native: true }, DataPlane::Ambient]
        .into_iter()
        .flat_map(|mesh| {
            [Shutdown::None, Shutdown::EnvoyDrain].map(|shutdown| Case {
                debounce,
                replicas: 2,
                ..Case::new(mesh, shutdown, Clients::NewConn)
            })
        })
        .collect();
    let started = std::time::Instant::now();
    let rows = run_together(&cases);
    println!(
        "{:<18} {:<34} {:>5} {:>6}  {:<22} {:>7} {:>7}  holds end after last request",
        "data plane", "app shutdown", "ok", "failed", "what failed", "pushed", "rollout"
    );
    // hey's errors in a word.
    let short = |e: &str| match e {
        "connection reset by peer" => "reset".to_string(),
        "connection refused" => "refused".to_string(),
        e if e.contains("Client.Timeout") => "timeout".to_string(),
        e => e.strip_prefix("status ").unwrap_or(e).to_string(),
    };
    for row in &rows {
        let what: Vec<String> =
            row.failed.iter().map(|(k, n)| format!("{n} {}", short(k))).collect();
        let holds: Vec<String> =
            row.holds.iter().filter_map(|(a, _)| a.map(|a| format!("{a:.1}s"))).collect();
        let pushed = row
            .propagation
            .iter()
            .flatten()
            .fold(None, |m: Option<f64>, &p| Some(m.map_or(p, |m| m.max(p))));
        println!(
            "{:<18} {:<34} {:>5} {:>6}  {:<22} {:>7} {:>6.1}s  {}",
            row.case.mesh_name(),
            row.case.shutdown_name(),
            row.ok,
            row.failed_total(),
            if what.is_empty() { "-".to_string() } else { what.join(", ") },
            pushed.map_or("-".to_string(), |p| format!("{p:.1}s")),
            row.took.as_secs_f64(),
            if holds.is_empty() { "-".to_string() } else { holds.join(" ") },
        );
    }
    eprintln!("the demo took {:.0?}", started.elapsed());
}
