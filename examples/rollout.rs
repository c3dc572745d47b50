//! The rollout table: `kubectl rollout restart` of three pods under 100 requests a second on a
//! real node (kubelet, containerd, runc, kube-proxy; tests/support/rollout.rs), one row per app
//! shutdown x clients. Arguments narrow it down: shutdowns (`none`, `sleep15`, `hold`) and
//! clients (`new-conn`, `keep-alive`); several of one sort are all run. Run it with
//! `bash examples/rollout.sh [ARG...]`, as root.

#[allow(dead_code)]
#[path = "../tests/support"]
mod support {
    pub mod built;
    pub mod cluster;
    pub mod netns;
    pub mod node;
    pub mod rollout;
}

use support::rollout::{Clients, Shutdown, run};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut shutdowns = Vec::new();
    let mut clients = Vec::new();
    for a in &args {
        match a.as_str() {
            "none" => shutdowns.push(Shutdown::None),
            "sleep15" => shutdowns.push(Shutdown::Sleep(15)),
            "hold" => shutdowns.push(Shutdown::Hold),
            "new-conn" => clients.push(Clients::NewConn),
            "keep-alive" => clients.push(Clients::KeepAlive),
            other => {
                eprintln!(
                    "rollout: {other:?}: expected none, sleep15, hold, new-conn or keep-alive"
                );
                std::process::exit(2);
            }
        }
    }
    if shutdowns.is_empty() {
        shutdowns = vec![Shutdown::None, Shutdown::Sleep(15), Shutdown::Hold];
    }
    if clients.is_empty() {
        clients = vec![Clients::NewConn, Clients::KeepAlive];
    }
    println!(
        "| mesh | app's preStop | clients | answered 200 | failed | what failed | rollout (to the last old pod gone) | each old pod's hold end after its last request |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &shutdown in &shutdowns {
        for &client in &clients {
            let row = run(shutdown, client);
            let what: Vec<String> = row.failed.iter().map(|(k, n)| format!("{n} {k}")).collect();
            let holds: Vec<String> = row
                .holds
                .iter()
                .map(|(after, _)| after.map_or("-".to_string(), |a| format!("{a:.1}s")))
                .collect();
            println!(
                "| no mesh | {} | {} | {} | {} | {} | {:.1}s | {} |",
                match shutdown {
                    Shutdown::None => "none".to_string(),
                    Shutdown::Sleep(s) => format!("sleep {s}s"),
                    Shutdown::Hold => "hold (policy)".to_string(),
                },
                match client {
                    Clients::NewConn => "new-conn",
                    Clients::KeepAlive => "keep-alive",
                },
                row.ok,
                row.failed_total(),
                if what.is_empty() { "-".to_string() } else { what.join(", ") },
                row.took.as_secs_f64(),
                holds.join(" "),
            );
            for (_, summary) in &row.holds {
                eprintln!("{shutdown:?} {client:?}: {summary}");
            }
        }
    }
}
