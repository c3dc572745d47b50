//! `kubectl rollout restart` under load on a real node (tests/support/node.rs, rollout.rs), one
//! row per data plane with envoy-drain as a user installs it: the kubelet runs the pods and their
//! preStop hooks and counts their grace period, the Deployment controller replaces them one after
//! the other, the EndpointSlice controller marks them terminating, and the client's data path
//! drops them: kube-proxy without a mesh (the hook examples/hold-policy.yaml adds), istiod's push
//! to the client's sidecar (examples/istio-template-values.yaml's `run` and `hold`), istiod's
//! push to the node's ztunnel in ambient mode (the policy's hold). The three run side by side in
//! one cluster, each in its namespace with its load, restarted at once, sidecars and ambient pods
//! served by one istiod, as the demo runs them. BENCHMARKS §10 has the other rows, each in a
//! cluster of its own (`bash examples/rollout.sh`). On three nodes, a node drain of the three data
//! planes side by side (BENCHMARKS §12 has the other ways a pod ends).

mod support;

use support::rollout::{
    Amount, Budget, Case, Clients, DataPlane, Operation, Row, Shutdown, run, run_together,
};

#[test]
#[ignore = "needs root, the control plane and the node built from source (`bash scripts/test`)"]
fn a_rollout_in_every_data_plane_at_once_loses_nothing_with_envoy_drain() {
    let cases = [DataPlane::None, DataPlane::Sidecar { native: true }, DataPlane::Ambient]
        .map(|mesh| Case::new(mesh, Shutdown::EnvoyDrain, Clients::NewConn));
    let rows = run_together(&cases);
    for row in &rows {
        eprintln!(
            "{}: rollout restart {:.1?}; {} answered 200; endpoints left the client after {:?}; \
             holds {:?}",
            row.case.mesh_name(),
            row.took,
            row.ok,
            row.propagation,
            row.holds
        );
    }
    // The rollout read back from the holds' records alone: a hold per replaced pod, each ended
    // on its own (examples/records.sh prints them as a table).
    let records: Vec<&str> =
        rows.iter().flat_map(|r| r.records.iter().map(String::as_str)).collect();
    let table = records_table(&records.join("\n"));
    eprintln!("{}\n{table}", records.join("\n"));
    let ended: Vec<(String, String)> = records
        .iter()
        .map(|r| serde_json::from_str::<serde_json::Value>(r).expect("a record in JSON"))
        .filter(|r| r["command"] == "hold" && r["exit_code"] == 0)
        .map(|r| (text(&r["namespace"]), text(&r["outcome"])))
        .collect();
    let namespaces =
        ["shop-0", "shop-0", "shop-0", "shop-1", "shop-1", "shop-1", "shop-2", "shop-2", "shop-2"];
    let mut ended_in: Vec<&str> = ended.iter().map(|(ns, _)| ns.as_str()).collect();
    ended_in.sort_unstable();
    assert_eq!(ended_in, namespaces, "{table}");
    // Each ended on its own: requests stopped (reached), or at its deadline with bytes only on
    // connections already open (kept_alive, exit 0 too: one CI run of six held an ambient pod so,
    // after bytes on ztunnel's HBONE connection 4 s into the hold that no new connection came
    // with; the pause before them asked for 24 s of quiet).
    let normal = ["reached", "kept_alive"];
    assert!(ended.iter().all(|(_, outcome)| normal.contains(&outcome.as_str())), "{table}");
    for row in &rows {
        // 100 a second from 5 s before the restart to 3 s after the last old pod is gone.
        nothing_lost(row, 2000);
        assert_eq!(row.holds.len(), 3, "a hold for each replaced pod");
        // The client's data path itself (kube-proxy's rules, istiod's push to the client's
        // Envoy or to ztunnel) dropped each old pod.
        assert!(row.propagation.iter().all(Option::is_some), "{:?}", row.propagation);
    }
}

#[test]
#[ignore = "needs root, the control plane and the node built from source (`bash scripts/test`)"]
fn a_node_drain_in_every_data_plane_at_once_loses_nothing_with_envoy_drain() {
    // Three nodes: each data plane's client on node-1, its four replicas spread over node-2 and
    // node-3 under a PodDisruptionBudget of minAvailable 75 % (three: one eviction at a time).
    // `kubectl drain node-2` evicts every data plane's pods there at once, the budget refusing a
    // second until the first one's replacement is ready on node-3; every node's kube-proxy, and
    // in ambient mode its ztunnel, learns of each on its own schedule.
    let cases =
        [DataPlane::None, DataPlane::Sidecar { native: true }, DataPlane::Ambient].map(|mesh| {
            Case {
                nodes: 3,
                replicas: 4,
                operation: Operation::Drain,
                budget: Budget::MinAvailable(Amount::Percent(75)),
                ..Case::new(mesh, Shutdown::EnvoyDrain, Clients::NewConn)
            }
        });
    let rows = run_together(&cases);
    for row in &rows {
        eprintln!(
            "{}: drain {:.1?}, {} evictions refused; {} answered 200; endpoints left the slowest \
             node after {:?}; holds {:?}",
            row.case.mesh_name(),
            row.took,
            row.refused,
            row.ok,
            row.propagation,
            row.holds
        );
    }
    for row in &rows {
        // 100 a second from 5 s before the drain to 3 s after node-2 is empty.
        nothing_lost(row, 800);
        assert!(!row.holds.is_empty(), "the drain evicted pods of {}", row.case.mesh_name());
        // Two pods on node-2 and a budget of one at a time: kubectl was refused (429) and retried.
        assert!(row.holds.len() < 2 || row.refused > 0, "{:?}: no 429", row.case.mesh_name());
        // Every node's data path dropped each evicted pod (a sidecar's: the client's).
        assert!(row.propagation.iter().all(Option::is_some), "{:?}", row.propagation);
    }
}

#[test]
#[ignore = "needs root, the control plane and the node built from source (`bash scripts/test`)"]
fn a_waypoints_rollout_loses_nothing_with_the_waypoint_preset() {
    // istiod's own waypoint for the namespace's services, two replicas, restarted under the load
    // of kept-alive clients (each a CONNECT stream through it for as long as it lives): the
    // preStop of examples/waypoint.yaml drains it and waits for its requests alone.
    let row = run(Case::new(DataPlane::Waypoint, Shutdown::EnvoyDrain, Clients::KeepAlive));
    eprintln!(
        "waypoint: rollout restart {:.1?}; {} answered 200; left ztunnel after {:?}; runs {:?}; {}",
        row.took, row.ok, row.propagation, row.holds, row.diagnosis
    );
    assert!(row.ok > 2000, "hey's requests were answered: {} ({:?})", row.ok, row.failed);
    assert_eq!(row.failed, [], "a request failed: {:?}; {}", row.holds, row.diagnosis);
    // `status` in a waypoint under that load: the requests counted, the clients' CONNECT streams
    // and the tunnels to the pods shown as Istio's own.
    eprintln!("{}", row.status);
    for shown in ["main_internal (Istio's own cluster)", "connect_originate (Istio's own cluster)"]
    {
        assert!(row.status.contains(shown), "{shown}: {}", row.status);
    }
    assert!(
        row.status.contains("inbound-vip|80|http|app.shop-0.svc.cluster.local"),
        "{}",
        row.status
    );
    // Each old waypoint's hook ended on its own once no request was in flight, well before its
    // deadline (50 s): not held by the clients' streams nor the tunnels to the pods.
    assert_eq!(row.records.len(), 2, "{:?}", row.holds);
    for record in &row.records {
        let r: serde_json::Value = serde_json::from_str(record).expect("a record in JSON");
        let said =
            [&r["command"], &r["preset"], &r["outcome"], &r["count_unit"], &r["count_source"]];
        assert_eq!(said, ["run", "waypoint", "reached", "requests", "clusters"], "{record}");
        assert!(r["elapsed_ms"].as_u64().is_some_and(|ms| ms < 30_000), "{record}");
    }
    // ztunnel itself dropped each old waypoint (istiod's push).
    assert!(row.propagation.iter().all(Option::is_some), "{:?}", row.propagation);
}

/// A record's text field, or what it was instead.
fn text(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// examples/records.sh's table of `records`.
fn records_table(records: &str) -> String {
    use std::io::Write;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/records.sh");
    let mut table = std::process::Command::new("bash")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("bash examples/records.sh");
    table.stdin.take().expect("its stdin").write_all(records.as_bytes()).expect("the records");
    let out = table.wait_with_output().expect("its table");
    assert!(out.status.success(), "examples/records.sh failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn records_read_back_into_a_table_skip_every_other_line() {
    let record = r#"{"time":"2026-11-29T10:20:13.042181Z","level":"info","logger":"envoy-drain","msg":"done after 6.7s: no request arrived for 1.7s","event":"summary","version":"0.1.0","pod":"app-1","namespace":"shop-0","command":"hold","preset":"none","outcome":"reached","exit_code":0,"elapsed_ms":6702,"deadline_ms":20000,"min_ms":3000,"quiet_ms":1700,"since_last_arrival_ms":1702,"count":0,"count_unit":"connections","count_source":"proc","count_failed":null,"warnings":["UDP is served on port 5353"],"dropped_lines":0}"#;
    let log =
        format!("received /local/0\n{{\"level\":\"info\",\"msg\":\"x\"}}\n{record}\nnot json {{\n");
    let table = records_table(&log);
    assert_eq!(
        table.lines().skip(2).collect::<Vec<_>>(),
        [
            "| shop-0 | app-1 | hold | none | reached | 0 | 6.702s | 1.702s | 1.7s | 0 (connections, proc) | 1 |"
        ]
    );
}

/// No request of `row` failed, more than `least` were answered, and each hold of a pod the
/// operation ended ended on its own once requests had stopped.
fn nothing_lost(row: &Row, least: u64) {
    assert!(row.ok > least, "hey's requests were answered: {} ({:?})", row.ok, row.failed);
    assert_eq!(
        row.failed,
        [],
        "a request failed during the rollout; the holds: {:?}; {}",
        row.holds,
        row.diagnosis
    );
    // Each ended pod's hold ended on its own, once requests had stopped: after its last one.
    for (after, summary) in &row.holds {
        let normal = ["no request arrived", "arriving only on kept-alive connections"];
        assert!(normal.iter().any(|n| summary.contains(n)), "{summary}");
        assert!(after.is_some_and(|a| a > 0.0), "{after:?} {summary}");
    }
}

#[test]
fn heys_summary_is_read_into_answers_and_named_failures() {
    // hey 1.x's bytes: the status codes, then the errors with their counts in brackets.
    let out = "Status code distribution:\n  [200]\t5334 responses\n  [503]\t2 responses\n\n\
               Error distribution:\n  [600]\tGet \"http://10.96.0.7/local/0.05\": dial tcp \
               10.96.0.7:80: connect: connection refused\n  [64]\tGet \
               \"http://10.96.0.7/local/0.05\": EOF\n  [1]\tGet \"http://10.96.0.7/local/0.05\": \
               read tcp 10.244.0.14:42486->10.96.0.7:80: read: connection reset by peer\n  [2]\t\
               Get \"http://10.96.0.7/local/0.05\": read tcp 10.244.0.14:42500->10.96.0.7:80: \
               read: connection reset by peer\n";
    let (ok, failed) = support::rollout::tally(out);
    assert_eq!(ok, 5334);
    assert_eq!(
        failed,
        [
            ("status 503".to_string(), 2),
            ("connection refused".to_string(), 600),
            ("EOF".to_string(), 64),
            ("connection reset by peer".to_string(), 3),
        ]
    );
}

#[test]
fn the_app_pods_in_the_clients_data_path_are_read_from_each_data_plane() {
    use support::rollout::endpoint_ips;
    // Envoy's /clusters: every host of the namespace's Service, whatever its health.
    let clusters = "outbound|80||app.shop-1.svc.cluster.local::10.244.0.3:8080::cx_active::2\n\
                    outbound|80||app.shop-1.svc.cluster.local::10.244.0.3:8080::health_flags::healthy\n\
                    outbound|80||app.shop-1.svc.cluster.local::10.244.0.4:8080::health_flags::healthy\n\
                    outbound|80||app.shop-2.svc.cluster.local::10.244.0.5:8080::health_flags::healthy\n\
                    outbound|443||kubernetes.default.svc.cluster.local::10.0.0.1:6443::health_flags::healthy\n";
    assert_eq!(endpoint_ips(clusters, "shop-1"), ["10.244.0.3", "10.244.0.4"]);
    // kube-proxy's rules (iptables-save -t nat): the namespace's Service's endpoints.
    let rules = "-A KUBE-SEP-ABC -p tcp -m comment --comment \"shop-1/app:http\" -m tcp -j DNAT \
                 --to-destination 10.244.0.7:8080\n-A KUBE-SEP-XYZ -p tcp -m comment --comment \
                 \"shop-2/app:http\" -m tcp -j DNAT --to-destination 10.244.0.8:8080\n\
                 -A KUBE-SEP-DEF -p tcp -m comment --comment \"default/kubernetes:https\" -m tcp \
                 -j DNAT --to-destination 10.0.0.1:6443\n";
    assert_eq!(endpoint_ips(rules, "shop-1"), ["10.244.0.7"]);
    // ztunnel's /config_dump: the Service's endpoints that are healthy, by pod; a workload's uid
    // as a value is not an endpoint.
    let dump = r#"{"services": [{"endpoints": {
        "Kubernetes//Pod/shop-1/app-1": {"port": {"80": 8080}, "status": "Healthy",
          "workloadUid": "Kubernetes//Pod/shop-1/app-1"},
        "Kubernetes//Pod/shop-1/app-2": {"port": {"80": 8080}, "status": "Unhealthy",
          "workloadUid": "Kubernetes//Pod/shop-1/app-2"},
        "Kubernetes//Pod/shop-2/app-4": {"port": {"80": 8080}, "status": "Healthy"}}}],
      "workloads": [{"uid": "Kubernetes//Pod/shop-1/app-3"}]}"#;
    assert_eq!(endpoint_ips(dump, "shop-1"), ["app-1"]);
}
