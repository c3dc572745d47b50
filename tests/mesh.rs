//! Pods deleted under live traffic in the mesh replica (support/mesh.rs): a client pod whose
//! sidecar learns of the deletion over EDS 2 s late sends 100 short requests a second (hey) to a
//! service of two pods, three 10 s requests are in flight at pod A when the kubelet stand-in
//! deletes it, and every request's outcome is counted. Each ordering of the kubelet runs with a
//! graceful app, under Istio's own shutdown and under envoy-drain as the injection template sets
//! it up; an app that stops serving at SIGTERM runs behind `hold` at 10 s propagation, with a
//! sidecar, in Istio's ambient mode and without a mesh (clients opening a connection per request,
//! the kubelet's tcpSocket probes every second, without a mesh from the node's own address on a
//! Calico-like network).

mod support;

use std::path::Path;
use std::time::Duration;
use support::kubelet::Probe;
use support::mesh::{self, AppKind, LONG, LoadKind, Mode, PreStop, RATE, ReplicaRow, Scenario};
use support::pod::{DataPlane, Gateway};

/// A graceful app's pod deleted under load, its sidecar classic or `native`, the proxy shutting
/// down as `mode` says.
fn deleted_under_load(native: bool, mode: Mode) -> ReplicaRow {
    run_scenario(Scenario {
        app: AppKind::Graceful,
        mode,
        propagation: Duration::from_secs(2),
        load: LoadKind::Http1,
        pre_stop: PreStop::None,
        mesh: DataPlane::Sidecar { native },
        keep_alive: true,
        rate: f64::from(RATE),
        probe: Probe::Http,
        gateway: Gateway::Bridge,
        outside: false,
    })
}

fn run_scenario(scenario: Scenario) -> ReplicaRow {
    mesh::run(&support::envoy::required(), Path::new(support::BIN), scenario)
}

/// The row as the table shows it, and the hook's summary.
fn shown(row: &ReplicaRow) -> String {
    format!(
        "\n{}hook: {}",
        mesh::table(std::slice::from_ref(row)),
        row.hook_summary.as_deref().unwrap_or("none")
    )
}

/// The load ran for the whole deletion: at least half its rate over the seconds it lasted.
fn load_ran(row: &ReplicaRow) {
    let least = (row.scenario.rate / 2.0 * row.gone()) as usize;
    assert!(
        row.sent >= least,
        "{} requests sent, expected at least {least} {}",
        row.sent,
        shown(row)
    );
}

/// No request failed, the long ones included, and the hook ended at zero.
fn no_request_failed(row: &ReplicaRow) {
    load_ran(row);
    assert_eq!(row.failed, 0, "{}", shown(row));
    assert_eq!(row.long_ok, LONG, "{}", shown(row));
    let hook = row.deletion.hook.as_ref().expect("the proxy's preStop hook ran");
    assert_eq!(hook.code, Some(0), "{hook}");
}

/// The proxy outlived its app, by less than pilot-agent's own 5 s would have added.
fn stopped_right_after_the_app(row: &ReplicaRow) {
    let after = row.app_exit_to_proxy_stop();
    assert!((0.0..2.5).contains(&after), "{}", shown(row));
}

#[test]
#[ignore = "needs root, iptables, setpriv, hey and Envoy: `bash scripts/test` runs it"]
fn classic_sidecar_with_envoy_drain_fails_no_request_while_its_pod_is_deleted_under_load() {
    let row = deleted_under_load(false, Mode::EnvoyDrain);
    no_request_failed(&row);
    // --then-quit: the proxy stops once the app has exited, not after pilot-agent's own 5 s.
    stopped_right_after_the_app(&row);
}

#[test]
#[ignore = "needs root, iptables, setpriv, hey and Envoy: `bash scripts/test` runs it"]
fn native_sidecar_with_envoy_drain_fails_no_request_while_its_pod_is_deleted_under_load() {
    let row = deleted_under_load(true, Mode::EnvoyDrain);
    no_request_failed(&row);
    // The hook never holds a proxy whose app has gone.
    stopped_right_after_the_app(&row);
}

#[test]
#[ignore = "needs root, iptables, setpriv, hey and Envoy: `bash scripts/test` runs it"]
fn classic_sidecar_with_istios_default_cuts_the_long_requests_off_after_5s() {
    // What the harness must be able to see: pilot-agent stops Envoy after its
    // terminationDrainDuration, under the long requests.
    let row = deleted_under_load(false, Mode::Istio);
    load_ran(&row);
    assert_eq!(row.long_ok, 0, "{}", shown(&row));
    assert!(row.kinds.reset >= LONG, "{}", shown(&row));
    assert!(row.app_exit_to_proxy_stop() < 0.0, "{}", shown(&row));
}

#[test]
#[ignore = "needs root, iptables, setpriv, hey and Envoy: `bash scripts/test` runs it"]
fn native_sidecar_with_istios_own_prestop_stops_the_proxy_as_the_app_exits() {
    // The kubelet sends a native sidecar SIGTERM only once the app has exited, and after its
    // `/drain` pilot-agent stops Envoy at once: nothing fails, nothing waits.
    let row = deleted_under_load(true, Mode::Istio);
    load_ran(&row);
    assert_eq!(row.failed, 0, "{}", shown(&row));
    let after = row.app_exit_to_proxy_stop();
    assert!((0.0..1.0).contains(&after), "{}", shown(&row));
}

/// An nginx-style app behind `hold`, its pod deleted when the mesh learns of it 10 s late; without
/// a sidecar its readiness probe is a tcpSocket one, from the node's own address without a mesh.
fn held(mesh: DataPlane, keep_alive: bool) -> ReplicaRow {
    run_scenario(Scenario {
        app: AppKind::Nginx,
        mode: Mode::EnvoyDrain,
        propagation: Duration::from_secs(10),
        load: LoadKind::Http1,
        pre_stop: PreStop::Hold,
        mesh,
        keep_alive,
        rate: f64::from(RATE),
        probe: Probe::Tcp,
        gateway: Gateway::LinkLocal,
        outside: false,
    })
}

/// No request failed, and the hold returned after its quiet time: at 100 requests a second its
/// 500 ms floor, arrivals read every 500 ms.
fn held_until_requests_stopped(row: &ReplicaRow) {
    load_ran(row);
    assert_eq!(row.failed, 0, "{}", shown(row));
    assert_eq!(row.long_ok, LONG, "{}", shown(row));
    let hold = row.deletion.app_hook.as_ref().expect("the app's hold ran");
    assert_eq!(hold.code, Some(0), "{hold}");
    let after = row.hold_after_last_arrival().expect("a last arrival at pod A");
    assert!((0.5..1.5).contains(&after), "{}\n{hold}", shown(row));
}

#[test]
#[ignore = "needs root, iptables, setpriv, hey and Envoy: `bash scripts/test` runs it"]
fn an_nginx_style_app_behind_hold_fails_no_request_when_the_mesh_learns_of_it_10s_late() {
    // Without `hold` such an app refuses what clients send until their sidecars drop it.
    let row = held(DataPlane::Sidecar { native: false }, true);
    no_request_failed(&row);
    held_until_requests_stopped(&row);
}

#[test]
#[ignore = "needs root, iptables, setpriv, hey and Envoy: `bash scripts/test` runs it"]
fn in_ambient_mode_hold_sees_each_new_connection_over_hbone_and_not_the_probes() {
    held_until_requests_stopped(&held(DataPlane::Ambient, false));
}

#[test]
#[ignore = "needs root, iptables, setpriv and hey: `bash scripts/test` runs it"]
fn without_a_mesh_hold_sees_each_new_connection_until_kube_proxy_drops_the_pod() {
    held_until_requests_stopped(&held(DataPlane::None, false));
}
