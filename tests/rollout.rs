//! `kubectl rollout restart` under load on a real node (tests/support/node.rs, rollout.rs): the
//! kubelet runs the pods and their preStop hooks and counts their grace period, the Deployment
//! controller replaces them one after the other, the EndpointSlice controller marks them
//! terminating and kube-proxy takes them out of the Service's rules. The hook is what
//! examples/hold-policy.yaml adds, with the image the ConfigMap names. BENCHMARKS §10 has the
//! other rows (`bash examples/rollout.sh`).

mod support;

use support::rollout::{Clients, Shutdown, run};

#[test]
#[ignore = "needs root, the control plane and the node built from source (`bash scripts/test`)"]
fn a_rollout_without_a_mesh_loses_nothing_with_the_policys_hold() {
    let row = run(Shutdown::Hold, Clients::NewConn);
    eprintln!("rollout restart: {:.1?}; {} answered 200; {:?}", row.took, row.ok, row.holds);
    // 100 a second for 60 s.
    assert!(row.ok > 5000, "hey's requests were answered: {} ({:?})", row.ok, row.failed);
    assert_eq!(
        row.failed,
        [],
        "a request failed during the rollout; the holds: {:?}; {}",
        row.holds,
        row.diagnosis
    );
    // Each replaced pod's hold ended on its own, once requests had stopped: after its last one.
    assert_eq!(row.holds.len(), 3);
    for (after, summary) in &row.holds {
        assert!(summary.contains("no request arrived"), "{summary}");
        assert!(after.is_some_and(|a| a > 0.0), "{after:?} {summary}");
    }
}

#[test]
fn heys_summary_is_read_into_answers_and_named_failures() {
    // hey 1.x's bytes: the status codes, then the errors with their counts in brackets.
    let out = "Status code distribution:\n  [200]\t5334 responses\n  [503]\t2 responses\n\n\
               Error distribution:\n  [600]\tGet \"http://10.96.0.7/local/0.05\": dial tcp \
               10.96.0.7:80: connect: connection refused\n  [64]\tGet \
               \"http://10.96.0.7/local/0.05\": EOF\n";
    let (ok, failed) = support::rollout::tally(out);
    assert_eq!(ok, 5334);
    assert_eq!(
        failed,
        [
            ("status 503".to_string(), 2),
            ("dial tcp 10.96.0.7:80: connect: connection refused".to_string(), 600),
            ("EOF".to_string(), 64),
        ]
    );
}
