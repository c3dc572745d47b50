//! envoy-drain against a real Envoy shaped like an Istio sidecar, each scenario in a network
//! namespace of its own with Istio's real port numbers (15000 admin, 15001 outbound, 15006
//! inbound, 15021 health, 15090 Prometheus) and a slow app on 8080. They need root and Envoy, so
//! a plain `cargo test` lists them as ignored; the README's test command installs Envoy and runs
//! them, where a missing prerequisite is a failure.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::app::App;
use support::envoy::{self, APP, Admin, Envoy, EnvoyOptions, HEALTH, INBOUND, OUTBOUND, UPSTREAM};
use support::http::{Conn, H2, in_flight};
use support::netns::in_private_netns;
use support::{command, run, spawn};

const SECOND: Duration = Duration::from_secs(1);

/// Runs `f` with Envoy's path in a private network namespace.
fn scenario(f: impl FnOnce(PathBuf) + Send + 'static) {
    let bin = envoy::required();
    in_private_netns(move || f(bin));
}

fn start(bin: &Path) -> Envoy {
    Envoy::start(bin, EnvoyOptions::default())
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn in_flight_requests_all_complete_and_run_exits_right_after_the_last() {
    scenario(|bin| {
        let app = App::start(APP, false);
        let _envoy = start(&bin);
        let requests: Vec<_> = ["/delay/1", "/delay/1.5", "/delay/2"]
            .into_iter()
            .map(|p| in_flight(INBOUND, p))
            .collect();
        app.wait_received(3, 10 * SECOND);
        let r = spawn(command(&["run", "--min-drain", "500ms"]));
        let mut last = Instant::now();
        for req in requests {
            let (resp, at) = req.join().unwrap().expect("the request completes");
            assert_eq!(resp.status, 200, "{resp:?}");
            assert!(resp.says_close(), "a drained listener says connection: close {resp:?}");
            last = last.max(at);
        }
        let out = r.finish();
        assert_eq!(out.code, Some(0), "{out}");
        let after = out.ended.saturating_duration_since(last);
        assert!(
            out.ended >= last && after < Duration::from_millis(500 + 500),
            "exited {after:?} after the last response (interval 500ms) {out}"
        );
        let seen = out.counts();
        assert_eq!(seen.first().map(String::as_str), Some("3 active connections (stats)"), "{out}");
        assert_eq!(seen.last().map(String::as_str), Some("0 active connections (stats)"), "{out}");
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn nothing_in_flight_exits_0_when_the_min_drain_ends_not_before() {
    scenario(|bin| {
        let _envoy = start(&bin);
        let out = run(command(&["run", "--min-drain", "1s"]));
        assert_eq!(out.code, Some(0), "{out}");
        assert!(out.elapsed >= SECOND && out.elapsed < 2 * SECOND, "{:?} {out}", out.elapsed);
        assert!(out.last_line().contains("0 active connections (stats)"), "{out}");
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn a_connection_that_never_closes_ends_at_the_deadline_naming_its_listener() {
    scenario(|bin| {
        let _envoy = start(&bin);
        let mut idle = Conn::open(INBOUND).unwrap();
        assert_eq!(idle.get("/ok").unwrap().status, 200);
        let out = run(command(&["run", "--min-drain", "0s", "--deadline", "2s"]));
        assert_eq!(out.code, Some(1), "{out}");
        assert!(
            out.elapsed >= 2 * SECOND && out.elapsed < Duration::from_millis(2300),
            "{:?} {out}",
            out.elapsed
        );
        assert!(
            out.last_line()
                .contains("with 1 active connection (stats) still open: listener 0.0.0.0_15006=1"),
            "{out}"
        );
        drop(idle);
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn without_connection_stats_run_counts_sockets_and_still_waits_for_requests() {
    scenario(|bin| {
        // In a pod being deleted the app stops too: it closes each connection after answering.
        let app = App::start(APP, true);
        let merge = vec!["tests/envoy/no-connection-stats.yaml"];
        let _envoy = Envoy::start(&bin, EnvoyOptions { merge, ..EnvoyOptions::default() });
        let requests: Vec<_> =
            ["/delay/1", "/delay/2"].into_iter().map(|p| in_flight(INBOUND, p)).collect();
        app.wait_received(2, 10 * SECOND);
        let r = spawn(command(&["run", "--min-drain", "500ms"]));
        let mut last = Instant::now();
        for req in requests {
            let (resp, at) = req.join().unwrap().expect("the request completes");
            assert_eq!(resp.status, 200, "{resp:?}");
            last = last.max(at);
        }
        let out = r.finish();
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            out.stderr.contains("stats unavailable (Envoy does not report downstream_cx_active")
                && out.stderr.contains(
                    "counting from the kernel's socket table (netlink sock_diag) instead"
                ),
            "{out}"
        );
        assert!(out.ended >= last, "exited before the last response {out}");
        assert!(
            out.counts().iter().any(|c| c.ends_with("(proc)") && !c.starts_with("0 ")),
            "{out}"
        );
        assert!(out.last_line().contains("0 active connections (proc)"), "{out}");
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn when_envoy_dies_run_counts_sockets_and_exits_by_what_is_really_open() {
    scenario(|bin| {
        let app = App::start(APP, true);
        let mut envoy = start(&bin);
        let request = in_flight(INBOUND, "/delay/2");
        app.wait_received(1, 10 * SECOND);
        let mut r = spawn(command(&["run", "--min-drain", "0s", "--interval", "100ms"]));
        r.expect_line("1 active connection (stats)", 10 * SECOND);
        envoy.kill();
        assert!(request.join().unwrap().is_err(), "the client lost its proxy");
        r.expect_line(
            "counting from the kernel's socket table (netlink sock_diag) instead",
            10 * SECOND,
        );
        // The app still holds its half of the upstream connection until its handler ends.
        let answered = app.wait_answered(10 * SECOND);
        let out = r.finish();
        assert_eq!(out.code, Some(0), "{out}");
        assert!(out.stderr.contains("connection refused"), "{out}");
        assert!(out.ended >= answered, "exited while the app still held a connection {out}");
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn drain_inbound_leaves_outbound_responses_alone_and_drain_all_does_not() {
    scenario(|bin| {
        let _envoy =
            Envoy::start(&bin, EnvoyOptions { drain_time_s: 30, ..EnvoyOptions::default() });
        let mut r = spawn(command(&["run", "--drain", "inbound", "--min-drain", "1s"]));
        r.expect_line("Envoy accepted the drain", 10 * SECOND);
        let outbound = Conn::open(OUTBOUND).unwrap().get("/ok").unwrap();
        let inbound = Conn::open(INBOUND).unwrap().get("/ok").unwrap();
        assert!(!outbound.says_close(), "outbound is not drained {outbound:?}");
        assert!(inbound.says_close(), "inbound is drained {inbound:?}");
        assert_eq!(r.finish().code, Some(0));

        let all = run(command(&["run", "--drain", "all", "--min-drain", "0s"]));
        assert_eq!(all.code, Some(0), "{all}");
        assert!(
            all.stderr.contains("drain_listeners?graceful&skip_exit answered 200 'OK'"),
            "{all}"
        );
        let outbound = Conn::open(OUTBOUND).unwrap().get("/ok").unwrap();
        assert!(outbound.says_close(), "outbound is drained too {outbound:?}");
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn a_request_arriving_during_the_min_drain_is_served() {
    scenario(|bin| {
        let _app = App::start(APP, false);
        let _envoy = start(&bin);
        let mut r = spawn(command(&["run", "--min-drain", "2s"]));
        r.expect_line("Envoy accepted the drain", 10 * SECOND);
        let late = Conn::open(INBOUND).unwrap().get("/delay/0.5").unwrap();
        let served_at = Instant::now();
        assert_eq!(late.status, 200, "{late:?}");
        assert!(late.says_close(), "{late:?}");
        let out = r.finish();
        assert_eq!(out.code, Some(0), "{out}");
        assert!(out.ended >= served_at, "{out}");
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn a_connection_made_after_envoys_own_drain_time_is_still_served_while_the_hook_waits() {
    // Envoy stops a gracefully drained listener when its --drain-time-s has passed, unless the
    // drain said skip_exit: clients whose endpoint list still has the pod must not be refused.
    scenario(|bin| {
        let _app = App::start(APP, false);
        let _envoy =
            Envoy::start(&bin, EnvoyOptions { drain_time_s: 1, ..EnvoyOptions::default() });
        let mut r = spawn(command(&["run", "--min-drain", "4s", "--deadline", "6s"]));
        r.expect_line("Envoy accepted the drain", 10 * SECOND);
        let drained = Instant::now();
        // A new connection every 200 ms, until well past Envoy's drain time of 1 s.
        let mut served = 0;
        while drained.elapsed() < 3 * SECOND && served < 20 {
            let late = Conn::open(INBOUND)
                .and_then(|mut c| c.get("/delay/0.2"))
                .unwrap_or_else(|e| panic!("refused {:?} after the drain: {e}", drained.elapsed()));
            assert_eq!(late.status, 200, "{late:?}");
            assert!(late.says_close(), "the listener is draining {late:?}");
            served += 1;
        }
        assert!(drained.elapsed() >= 2 * SECOND, "{served} served");
        let out = r.finish();
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            out.stderr.contains("drain_listeners?inboundonly&graceful&skip_exit answered 200 'OK'"),
            "{out}"
        );
    });
}

/// The count in the row of a status table named `name` (`0.0.0.0_15006`, `port 15006`).
fn row(stdout: &str, name: &str) -> Option<u64> {
    stdout.lines().find_map(|l| {
        let rest = l.trim_start().strip_prefix(name)?;
        let count = rest.strip_prefix(char::is_whitespace)?.trim();
        count.parse().ok()
    })
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn status_shows_the_connections_the_test_holds_per_listener_and_per_port() {
    scenario(|bin| {
        let _envoy = start(&bin);
        let mut held = Vec::new();
        for (addr, path) in
            [(INBOUND, "/ok"), (INBOUND, "/ok"), (OUTBOUND, "/ok"), (HEALTH, "/healthz/ready")]
        {
            let mut c = Conn::open(addr).unwrap();
            assert_eq!(c.get(path).unwrap().status, 200);
            held.push(c);
        }
        let out = run(command(&["status"]));
        assert_eq!(out.code, Some(0), "{out}");
        assert_eq!(row(&out.stdout, "0.0.0.0_15006"), Some(2), "{out}");
        assert_eq!(row(&out.stdout, "0.0.0.0_15001"), Some(1), "{out}");
        assert_eq!(row(&out.stdout, "0.0.0.0_15021"), None, "{out}");
        assert!(
            out.stdout.contains("not counted: 0.0.0.0_15021 (ignored port), 1 active"),
            "{out}"
        );
        assert_eq!(row(&out.stdout, "port 15006"), Some(2), "{out}");
        assert_eq!(row(&out.stdout, "port 15001"), Some(1), "{out}");
        assert!(out.stdout.contains("run would count 3 active connections (from stats)"), "{out}");
        drop(held);
    });
}

/// Istio 1.31's mTLS metrics listeners as its bootstrap template names and binds them
/// (tools/packaging/common/envoy_bootstrap.json, `secure_metrics_port`), at the ports of Istio's
/// own tests; plain HTTP here, as the count does not look at the transport.
const SECURE_METRICS: &str = "
static_resources:
  listeners:
  - name: 0.0.0.0_15091
    address: { socket_address: { address: 0.0.0.0, port_value: 15091 } }
    filter_chains: &metrics
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          '@type': type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: stats
          route_config:
            virtual_hosts:
            - { name: m, domains: ['*'], routes: [{ match: { prefix: / }, direct_response: { status: 200 } }] }
          http_filters:
          - name: envoy.filters.http.router
            typed_config: { '@type': type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
  - name: 0.0.0.0_15092
    address: { socket_address: { address: 0.0.0.0, port_value: 15092 } }
    filter_chains: *metrics
";

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn a_scrape_of_istios_mtls_metrics_listeners_holds_run_only_where_the_proxy_does_not_set_them() {
    scenario(|bin| {
        let yaml = SECURE_METRICS.to_string();
        let _envoy = Envoy::start(&bin, EnvoyOptions { yaml, ..EnvoyOptions::default() });
        let mut scrapes = Vec::new();
        for addr in ["127.0.0.1:15091", "127.0.0.1:15092"] {
            let mut c = Conn::open(addr).unwrap();
            assert_eq!(c.get("/stats/prometheus").unwrap().status, 200);
            scrapes.push(c);
        }
        // The istio-proxy container's environment, as istiod injects proxyMetadata.
        let in_the_proxy = |args: &[&str]| {
            let mut c = command(args);
            c.env("ENVOY_SECURE_METRICS_PORT", "15091")
                .env("ENVOY_SECURE_MERGED_METRICS_PORT", "15092");
            c
        };
        let out = run(command(&["status"]));
        assert!(out.stdout.contains("run would count 2 active connections (from stats)"), "{out}");
        let out = run(in_the_proxy(&["status"]));
        assert!(out.stdout.contains("run would count 0 active connections (from stats)"), "{out}");
        assert!(out.stdout.contains("0.0.0.0_15091 (ignored port), 1 active"), "{out}");
        let out = run(in_the_proxy(&["run", "--min-drain", "0s", "--deadline", "5s"]));
        assert_eq!(out.code, Some(0), "the scrapes never held the hook to its deadline {out}");
        drop(scrapes);
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn ipv6_listeners_count_under_their_real_stat_names_unless_their_port_is_ignored() {
    scenario(|bin| {
        let _envoy = start(&bin);
        let mut inbound = Conn::open("[::1]:15006").unwrap();
        assert_eq!(inbound.get("/ok").unwrap().status, 200);
        let mut health = Conn::open("[::1]:15021").unwrap();
        assert_eq!(health.get("/healthz/ready").unwrap().status, 200);
        let out = run(command(&["status", "--source", "stats"]));
        assert_eq!(out.code, Some(0), "{out}");
        assert_eq!(row(&out.stdout, "[__1]_15006"), Some(1), "{out}");
        assert!(out.stdout.contains("not counted: [__1]_15021 (ignored port), 1 active"), "{out}");
        assert!(out.stdout.contains("run would count 1 active connection (from stats)"), "{out}");
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn two_runs_at_once_both_drain_harmlessly_and_wait_for_the_same_request() {
    // Kubernetes may run a hook again while the first is still going.
    scenario(|bin| {
        let app = App::start(APP, false);
        let _envoy = start(&bin);
        let request = in_flight(INBOUND, "/delay/1.5");
        app.wait_received(1, 10 * SECOND);
        let args = ["run", "--min-drain", "0s", "--interval", "100ms"];
        let runs = [spawn(command(&args)), spawn(command(&args))];
        let (resp, answered) = request.join().unwrap().expect("the request completes");
        assert_eq!(resp.status, 200, "{resp:?}");
        for r in runs {
            let out = r.finish();
            assert_eq!(out.code, Some(0), "{out}");
            assert!(out.stderr.contains("Envoy accepted the drain"), "{out}");
            assert_eq!(
                out.counts().first().map(String::as_str),
                Some("1 active connection (stats)"),
                "{out}"
            );
            assert!(
                out.ended >= answered && out.ended - answered < SECOND,
                "both wait for the response and end soon after it {out}"
            );
        }
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn counting_requests_ignores_an_idle_connection_that_holds_a_connection_count_to_its_deadline() {
    scenario(|bin| {
        let app = App::start(APP, false);
        let _envoy = start(&bin);
        // A client's idle keep-alive pool: one connection, no request.
        let mut idle = Conn::open(INBOUND).unwrap();
        assert_eq!(idle.get("/ok").unwrap().status, 200);
        let slow = in_flight(INBOUND, "/delay/1.5");
        app.wait_received(1, 10 * SECOND);
        let requests = spawn(command(&[
            "run",
            "--count",
            "requests",
            "--min-drain",
            "0s",
            "--deadline",
            "8s",
        ]));
        let connections = spawn(command(&["run", "--min-drain", "0s", "--deadline", "3s"]));
        let (resp, answered) = slow.join().unwrap().expect("the slow request completes");
        assert_eq!(resp.status, 200, "{resp:?}");

        let out = requests.finish();
        assert_eq!(out.code, Some(0), "{out}");
        assert_eq!(
            out.counts().first().map(String::as_str),
            Some("1 active request (stats)"),
            "{out}"
        );
        assert!(
            out.ended >= answered && out.ended - answered < SECOND,
            "exits right after the slow response {out}"
        );
        let out = connections.finish();
        assert_eq!(out.code, Some(1), "{out}");
        assert!(
            out.last_line()
                .contains("1 active connection (stats) still open: listener 0.0.0.0_15006=1"),
            "the idle connection holds the connection count to the deadline {out}"
        );
        drop(idle);
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn a_tcp_proxy_stream_keeps_a_request_count_waiting() {
    scenario(|bin| {
        let _app = App::start(APP, false);
        let _envoy = start(&bin);
        let stream = std::net::TcpStream::connect("127.0.0.1:3306").unwrap();
        let out =
            run(command(&["run", "--count", "requests", "--min-drain", "0s", "--deadline", "2s"]));
        assert_eq!(out.code, Some(1), "{out}");
        assert!(
            out.last_line().contains(
                "0 active requests and 1 non-HTTP connection (stats) still open: non-HTTP connections=1"
            ),
            "{out}"
        );
        drop(stream);
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn http2_streams_on_one_connection_count_as_several_requests() {
    scenario(|bin| {
        let app = App::start(APP, false);
        let _envoy = start(&bin);
        let mut h2 = H2::open(INBOUND).unwrap();
        for _ in 0..3 {
            h2.get("/delay/1.5").unwrap();
        }
        app.wait_received(3, 10 * SECOND);
        let status = run(command(&["status", "--source", "stats", "--count", "requests"]));
        let row: Option<Vec<&str>> = status
            .stdout
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.first() == Some(&"inbound_0.0.0.0_8080"));
        assert_eq!(
            row,
            Some(vec!["inbound_0.0.0.0_8080", "3", "1"]),
            "three requests on one connection {status}"
        );
        support::counts_three_streams_then_zero(command(&support::RUN_REQUESTS), &h2, "stats");
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn with_connection_stats_only_requests_come_from_clusters_and_an_idle_connection_does_not_count() {
    // What EXIT_ON_ZERO_ACTIVE_CONNECTIONS makes Istio enable: downstream_cx_active, no request
    // gauge. Envoy's per-host counters still know the requests in flight.
    scenario(|bin| {
        let app = App::start(APP, false);
        let merge = vec!["tests/envoy/cx-stats-only.yaml"];
        let _envoy = Envoy::start(&bin, EnvoyOptions { merge, ..EnvoyOptions::default() });
        let mut idle = Conn::open(INBOUND).unwrap();
        assert_eq!(idle.get("/ok").unwrap().status, 200);
        let slow = in_flight(INBOUND, "/delay/1");
        app.wait_received(1, 10 * SECOND);
        let out = run(command(&["run", "--count", "requests", "--min-drain", "0s"]));
        let (resp, answered) = slow.join().unwrap().expect("the request completes");
        assert_eq!(resp.status, 200);
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            out.stderr.contains(
                "request stats unavailable (Envoy does not report downstream_rq_active (its stats_matcher leaves the stat out)); counting requests in flight from Envoy's /clusters instead"
            ),
            "{out}"
        );
        assert_eq!(
            out.counts().first().map(String::as_str),
            Some("1 active request (clusters)"),
            "{out}"
        );
        assert!(
            out.ended >= answered && out.ended - answered < SECOND,
            "ends right after the response, the idle connection still open {out}"
        );
        drop(idle);
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn an_admin_api_on_a_unix_socket_is_asked_and_tells_envoys_sockets_apart() {
    // Contour's and Kuma's admin APIs listen on a Unix socket only.
    scenario(|bin| {
        let envoy =
            Envoy::start(&bin, EnvoyOptions { admin: Admin::Unix, ..EnvoyOptions::default() });
        let socket = envoy.admin_socket();
        let admin = format!("unix:{}", socket.display());
        let mut held = Conn::open(INBOUND).unwrap();
        assert_eq!(held.get("/ok").unwrap().status, 200);
        let out = run(command(&["status", "--admin", &admin]));
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            out.stdout.contains(&format!(
                "stats: GET /stats?usedonly&type=Gauges&filter=downstream_cx_active%24 on {admin}"
            )),
            "{out}"
        );
        assert_eq!(row(&out.stdout, "0.0.0.0_15006"), Some(1), "{out}");
        assert!(
            out.stdout.contains(&format!("which holds the admin listener {admin}")),
            "the socket table found Envoy as the holder of the Unix socket {out}"
        );
        assert_eq!(row(&out.stdout, "port 15006"), Some(1), "{out}");
        // A pattern with one match is that socket; a connection held keeps `run` to its deadline,
        // and it drains through the socket.
        let pattern = format!("unix:{}/*.sock", socket.parent().unwrap().display());
        let out =
            run(command(&["run", "--admin", &pattern, "--deadline", "2s", "--min-drain", "0s"]));
        assert_eq!(out.code, Some(1), "{out}");
        assert!(
            out.stderr.contains(&format!(
                "draining inbound listeners (POST /drain_listeners?inboundonly&graceful&skip_exit on {admin})"
            )),
            "{out}"
        );
        assert!(out.last_line().contains("1 active connection (stats) still open"), "{out}");
        drop(held);
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn fail_healthcheck_makes_envoy_answer_503_before_the_drain_and_status_shows_it() {
    // A gateway behind a cloud load balancer: the balancer learns from the failing health check
    // to stop sending, as Envoy Gateway's, Contour's and Kuma's own shutdowns do.
    scenario(|bin| {
        let _envoy = start(&bin);
        let ready = || {
            Conn::open(envoy::ADMIN).and_then(|mut c| c.get("/ready")).map(|r| r.status).unwrap()
        };
        assert_eq!(ready(), 200);
        let before = run(command(&["status"]));
        assert!(
            before.stdout.starts_with(
                "ready: GET http://127.0.0.1:15000/ready answered 200 'LIVE': Envoy passes its health checks\n"
            ),
            "{before}"
        );
        let mut r = spawn(command(&["run", "--fail-healthcheck", "--min-drain", "1s"]));
        r.expect_line(
            "Envoy fails its health checks now (/ready answers 503): POST http://127.0.0.1:15000/healthcheck/fail answered 200 'OK'",
            10 * SECOND,
        );
        r.expect_line("Envoy accepted the drain", 10 * SECOND);
        assert_eq!(ready(), 503, "load balancers that ask are told to stop sending");
        let during = run(command(&["status"]));
        assert!(
            during.stdout.contains("answered 503 'DRAINING': Envoy fails its health checks"),
            "{during}"
        );
        let out = r.finish();
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            out.stderr.contains(
                "failing Envoy's health checks (POST http://127.0.0.1:15000/healthcheck/fail), then draining inbound listeners"
            ),
            "{out}"
        );
    });
}

/// An Envoy-based proxy's shape of bootstrap, for its preset's suite: where its admin API is,
/// where its traffic comes in, its own listeners, and the own listener whose `/slow` is a request
/// of its own in flight (3 s, on one of its own clusters).
struct Shape {
    preset: &'static str,
    yaml: &'static str,
    admin: Admin,
    traffic: &'static str,
    own: &'static [&'static str],
    own_slow: &'static str,
    drains: &'static str,
}

/// A preset's suite, on its proxy's shape: with Envoy's stats, then with none (Istio's stats
/// matcher), where the count comes from the socket table and the requests from /clusters. Both
/// times the proxy's own listeners never count, the traffic's connection does, and a request of
/// the traffic's holds `run` until it ends while one of the proxy's own does not.
fn preset_suite(shape: Shape) {
    scenario(move |bin| {
        for stats in [true, false] {
            let app = App::start(APP, false);
            let mut merge = vec![shape.yaml];
            if !stats {
                merge.push("tests/envoy/no-connection-stats.yaml");
            }
            let envoy = Envoy::start(
                &bin,
                EnvoyOptions { merge, admin: shape.admin, ..EnvoyOptions::default() },
            );
            // The preset's own --admin, but for the Unix socket's directory, which is the test's.
            let mut preset = vec!["--preset".to_string(), shape.preset.to_string()];
            if shape.admin == Admin::Unix {
                preset
                    .extend(["--admin".into(), format!("unix:{}", envoy.admin_socket().display())]);
            }
            let preset: Vec<&str> = preset.iter().map(String::as_str).collect();
            let mut own = Vec::new();
            for addr in shape.own {
                let mut c = Conn::open(addr).unwrap();
                assert_eq!(c.get("/ready").unwrap().status, 200, "{addr}");
                own.push(c);
            }
            let idle = only_the_traffic_counts(&shape, &preset, stats);
            requests_of_the_traffic_alone_hold_run(&shape, &preset, stats, &app, idle);
            drop(own);
        }
    });
}

/// `status` with the proxy's own connections open: none counts; with the traffic's connection
/// open, it does. Gives that connection.
fn only_the_traffic_counts(shape: &Shape, preset: &[&str], stats: bool) -> Conn {
    let (what, source) = if stats { ("stats", "stats") } else { ("no stats", "proc") };
    let out = run(command(&[&["status"][..], preset].concat()));
    assert!(
        out.stdout.contains("run would count 0 active connections (from "),
        "{what}: the proxy's own listeners never count {out}"
    );
    let mut traffic = Conn::open(shape.traffic).unwrap();
    assert_eq!(traffic.get("/delay/0").unwrap().status, 200);
    let out = run(command(&[&["status"][..], preset].concat()));
    assert!(
        out.stdout.contains(&format!("run would count 1 active connection (from {source}")),
        "{what}: the traffic's connection counts {out}"
    );
    traffic
}

/// Requests: one of the proxy's own in flight never holds the hook, the traffic's does, and the
/// traffic's `idle` keep-alive connection (a load balancer's pool) does not.
fn requests_of_the_traffic_alone_hold_run(
    shape: &Shape,
    preset: &[&str],
    stats: bool,
    app: &App,
    idle: Conn,
) {
    let (what, source) = if stats { ("stats", "stats") } else { ("no stats", "proc") };
    let theirs = in_flight(shape.own_slow, "/slow");
    let ours = in_flight(shape.traffic, "/delay/1");
    app.wait_received(3, 10 * SECOND);
    let mut args = vec!["run", "--count", "requests", "--min-drain", "0s"];
    args.extend_from_slice(preset);
    let started = Instant::now();
    let out = spawn(command(&args)).finish();
    let (resp, ended) = ours.join().unwrap().unwrap();
    assert_eq!(resp.status, 200, "{what}: the drain let the request finish");
    assert_eq!(out.code, Some(0), "{what} {out}");
    assert!(out.ended >= ended, "{what}: the hook waited for the request {out}");
    // What a connection count (Envoy Gateway's and Contour's own) still sees.
    let left = run(command(&[&["status"][..], preset].concat()));
    assert!(
        left.stdout.contains(&format!("run would count 1 active connection (from {source}")),
        "{what}: the idle connection outlives the drain {left}"
    );
    drop(idle);
    assert!(out.stderr.contains(shape.drains), "{what} {out}");
    if !stats {
        let instead = "counting requests in flight from Envoy's /clusters instead";
        assert!(out.stderr.contains(instead), "{what} {out}");
    }
    let (resp, their_end) = theirs.join().unwrap().unwrap();
    assert_eq!(resp.status, 200);
    assert!(
        out.ended < their_end,
        "{what}: the proxy's own 3 s request did not hold the hook {out}"
    );
    // The figures for docs/running.md, shown with --nocapture.
    println!(
        "{} ({what}): run ended {} ms after it started and {} ms after the traffic's 1 s \
         request, {} ms before the proxy's own 3 s request; an idle connection still open",
        shape.preset,
        out.ended.duration_since(started).as_millis(),
        out.ended.duration_since(ended).as_millis(),
        their_end.duration_since(out.ended).as_millis(),
    );
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn the_consul_preset_counts_the_public_listener_and_never_consuls_own() {
    preset_suite(Shape {
        preset: "consul",
        yaml: "tests/envoy/consul-like.yaml",
        admin: Admin::Tcp("127.0.0.1:19000"),
        traffic: "127.0.0.1:20000",
        own: &["127.0.0.1:20200", "127.0.0.1:21000"],
        own_slow: "127.0.0.1:20200",
        drains: "draining inbound listeners (POST http://127.0.0.1:19000/drain_listeners?inboundonly&graceful&skip_exit)",
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn the_kuma_preset_counts_the_inbound_listener_and_never_kumas_own() {
    preset_suite(Shape {
        preset: "kuma",
        yaml: "tests/envoy/kuma-like.yaml",
        admin: Admin::Unix,
        traffic: "127.0.0.1:18080",
        own: &["127.0.0.1:9901", "127.0.0.1:5670"],
        own_slow: "127.0.0.1:5670",
        drains: "draining inbound listeners (POST /drain_listeners?inboundonly&graceful&skip_exit on unix:",
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn the_envoy_gateway_preset_drains_all_counts_the_gateway_listener_and_never_its_own() {
    preset_suite(Shape {
        preset: "envoy-gateway",
        yaml: "tests/envoy/envoy-gateway-like.yaml",
        admin: Admin::Tcp("127.0.0.1:19000"),
        traffic: "127.0.0.1:10080",
        own: &["127.0.0.1:19001", "127.0.0.1:19003"],
        own_slow: "127.0.0.1:19001",
        drains: "draining all listeners (POST http://127.0.0.1:19000/drain_listeners?graceful&skip_exit)",
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn the_contour_preset_drains_all_counts_the_traffic_listener_and_never_contours_own() {
    preset_suite(Shape {
        preset: "contour",
        yaml: "tests/envoy/contour-like.yaml",
        admin: Admin::Unix,
        traffic: "127.0.0.1:18080",
        own: &["127.0.0.1:8002", "127.0.0.1:9001"],
        own_slow: "127.0.0.1:8002",
        drains: "draining all listeners (POST /drain_listeners?graceful&skip_exit on unix:",
    });
}

/// `hold` with a quiet time of 1 s, and this minimum and deadline.
fn holding(min: &str, deadline: &str) -> support::Running {
    spawn(command(&["hold", "--min", min, "--quiet", "1s", "--deadline", deadline]))
}

/// Where a client outside the pod (`netns::outside`) reaches the pod's `port`.
fn from_outside(port: u16) -> String {
    format!("{}:{port}", support::netns::POD_SIDE)
}

/// The hold returned 0, its quiet time after the `last` arrival (at least the 1 s floor), and not
/// much later: a few seconds where one kept-alive client's rate is told by the share of reads
/// that saw it (src/wait.rs), far from the propagation's 15 s.
fn returned_a_quiet_time_after(out: &support::Finished, last: Instant) {
    assert_eq!(out.code, Some(0), "{out}");
    assert!(
        out.ended >= last + SECOND && out.ended < last + 5 * SECOND,
        "returned {:?} after the last arrival (quiet 1s) {out}",
        out.ended.saturating_duration_since(last)
    );
}

/// Sends to `addr` every `every` until `until`: HTTP requests on one keep-alive connection, or
/// with `tcp` one new connection each (through Envoy's tcp_proxy, which connects to the app at
/// once). Gives when the last one was sent.
fn arrivals(
    addr: String,
    every: Duration,
    until: Instant,
    tcp: bool,
) -> std::thread::JoinHandle<Instant> {
    std::thread::spawn(move || {
        let mut conn = (!tcp).then(|| Conn::open(&addr).expect("a connection to Envoy"));
        let mut last = Instant::now();
        // Bounded by `until`, and by count.
        for _ in 0..1000 {
            if Instant::now() >= until {
                break;
            }
            last = Instant::now();
            match &mut conn {
                Some(c) => assert_eq!(c.get("/work").expect("an answer").status, 200),
                None => drop(std::net::TcpStream::connect(&addr).expect("a TCP connection")),
            }
            std::thread::sleep(every);
        }
        last
    })
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn hold_returns_a_quiet_time_after_the_last_http_request_and_the_apps_calls_out_never_hold_it() {
    scenario(|bin| {
        let _app = App::start(APP, false);
        let _upstream = App::start(UPSTREAM, false);
        let _envoy = start(&bin);
        let outside = support::netns::outside();
        let hold = holding("1s", "15s");
        let start = Instant::now();
        // 20 a second: 7 mean gaps are less than the quiet time's 1 s floor.
        let inbound =
            outside.enter(|| arrivals(from_outside(15006), SECOND / 20, start + 3 * SECOND, false));
        // The app's own calls through the sidecar go on after that: they never arrive at it.
        let outbound = arrivals(OUTBOUND.to_string(), SECOND / 5, start + 8 * SECOND, false);
        let last = inbound.join().unwrap();
        let out = hold.finish();
        outbound.join().unwrap();
        returned_a_quiet_time_after(&out, last);
        assert!(out.stderr.contains("and new requests still arriving"), "{out}");
        assert!(
            out.last_line().contains(": no request arrived for ")
                && out.last_line().contains(" (proc); the app gets its SIGTERM now"),
            "{out}"
        );
        // `status` shows what `hold` reads: every request that arrived at the app, and none of
        // the app's own calls out.
        let status = run(command(&["status", "--count", "requests"]));
        let so_far = status
            .stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("arrived at the app so far, which `hold` reads: "))
            .and_then(|l| l.split(' ').next()?.parse::<u64>().ok());
        assert!(
            so_far.is_some_and(|n| (20..=61).contains(&n)),
            "a request every 50 ms after the last answer, for 3 s {status}"
        );
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn hold_returns_a_quiet_time_after_the_last_tcp_connection() {
    scenario(|bin| {
        let _app = App::start(APP, false);
        let _envoy = start(&bin);
        let outside = support::netns::outside();
        let hold = holding("1s", "15s");
        let until = Instant::now() + 3 * SECOND;
        let last = outside.enter(|| arrivals(from_outside(3306), SECOND / 10, until, true));
        let last = last.join().unwrap();
        returned_a_quiet_time_after(&hold.finish(), last);
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn hold_holds_to_its_deadline_while_requests_keep_arriving() {
    scenario(|bin| {
        let _app = App::start(APP, false);
        let _envoy = start(&bin);
        let outside = support::netns::outside();
        let hold = holding("0s", "3s");
        let until = Instant::now() + 5 * SECOND;
        let sender = outside.enter(|| arrivals(from_outside(15006), SECOND / 3, until, false));
        let out = hold.finish();
        sender.join().unwrap();
        assert_eq!(out.code, Some(1), "{out}");
        assert!(
            out.last_line()
                .contains("deadline of 3s passed after 3.0s with requests still arriving, ")
                && out.last_line().contains(" (proc)"),
            "{out}"
        );
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn hold_keeps_its_pace_through_a_stopped_envoy_and_ends_after_the_load_with_exit_0() {
    // A kept-alive client at 10 a second; Envoy stopped for 3 s in the middle: the reads that
    // wait on it are unknown, not quiet, and do not slow the reads after it.
    scenario(|bin| {
        let _app = App::start(APP, false);
        let envoy = start(&bin);
        let outside = support::netns::outside();
        let mut hold = holding("1s", "20s");
        hold.expect_line("and no new request", 5 * SECOND);
        let until = Instant::now() + 7 * SECOND;
        let load = outside.enter(|| arrivals(from_outside(15006), SECOND / 10, until, false));
        hold.expect_line("and new requests still arriving", 5 * SECOND);
        envoy.signal(libc::SIGSTOP);
        std::thread::sleep(3 * SECOND);
        envoy.signal(libc::SIGCONT);
        let last = load.join().unwrap();
        let out = hold.finish();
        returned_a_quiet_time_after(&out, last);
        assert!(out.stderr.contains("arrivals unknown"), "the stalled reads are told {out}");
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn hold_sees_clients_queue_at_a_stopped_envoy_and_returns_only_after_the_last() {
    // Envoy frozen (a starved proxy container) while clients connect: their connections wait in
    // its listener's queue, where the socket table shows them; /clusters cannot answer until it
    // thaws, and then its workers have not yet taken them.
    scenario(|bin| {
        let _app = App::start(APP, false);
        let envoy = start(&bin);
        let outside = support::netns::outside();
        let mut hold = holding("1s", "20s");
        hold.expect_line("and no new request", 5 * SECOND);
        envoy.signal(libc::SIGSTOP);
        let until = Instant::now() + 3 * SECOND;
        let last = outside.enter(|| arrivals(from_outside(15006), SECOND / 10, until, true));
        let last = last.join().unwrap();
        envoy.signal(libc::SIGCONT);
        returned_a_quiet_time_after(&hold.finish(), last);
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn hold_counts_clients_that_reach_the_app_past_the_sidecar_and_warns() {
    // As Istio's excludeInboundPorts lets them: /clusters sees none of these requests.
    scenario(|bin| {
        let outside = support::netns::outside();
        let _app = App::start(&from_outside(8080), false);
        let _envoy = start(&bin);
        let hold = holding("1s", "15s");
        let until = Instant::now() + 3 * SECOND;
        let last = outside.enter(|| arrivals(from_outside(8080), SECOND / 10, until, true));
        let last = last.join().unwrap();
        let out = hold.finish();
        returned_a_quiet_time_after(&out, last);
        assert!(
            out.stderr.contains("the socket table sees arrivals that Envoy's /clusters does not"),
            "{out}"
        );
    });
}

/// One request on a connection of its own to Istio's passthrough listener (tests/envoy/
/// passthrough.yaml), for the app's port; Envoy answers, then closes first, as `connection: close`
/// asks, so the pod's end of the connection stays in the table in TIME_WAIT.
fn passthrough_request() {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(from_outside(8443)).expect("the listener");
    let request = "GET / HTTP/1.1\r\nHost: app\r\nx-envoy-original-dst-host: 127.0.0.1:8080\r\n\
        connection: close\r\n\r\n";
    conn.write_all(request.as_bytes()).unwrap();
    conn.set_read_timeout(Some(5 * SECOND)).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("Envoy's answer, then its close");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn hold_sees_each_request_to_a_host_that_envoy_removed_when_idle_and_made_again() {
    // A request every 3 s to the passthrough cluster, each just before a read: Envoy removes the
    // app's host between two (its cleanup interval is 1 s) and makes it again for the next, whose
    // rq_total reads 1 again where the old host's read 1. /clusters alone sees no arrival after
    // the first; the client's new connection to the sidecar is one.
    scenario(|bin| {
        let _app = App::start(APP, true);
        let merge = vec!["tests/envoy/passthrough.yaml"];
        let _envoy = Envoy::start(&bin, EnvoyOptions { merge, ..EnvoyOptions::default() });
        let outside = support::netns::outside();
        let args = ["--min", "12s", "--quiet", "1s", "--interval", "3s", "--deadline", "14s"];
        let mut hold = spawn(command(&[&["hold", "--verbose"], &args[..]].concat()));
        // Each read's line, until the minimum ends: `...; at least 9.0s more`.
        let read = "s more";
        hold.expect_line(read, 5 * SECOND);
        for _ in 0..3 {
            // Timed, not awaited: the request must land half a second before the next read.
            std::thread::sleep(Duration::from_millis(2500));
            outside.enter(passthrough_request);
            let line = hold.expect_line(read, 5 * SECOND);
            assert!(line.contains("and new requests still arriving"), "{line}");
        }
        // Too sparse to tell their end before the deadline, which is the propagation too: the hold
        // returns there, as `sleep` would, with exit 0.
        let out = hold.finish();
        assert_eq!(out.code, Some(0), "{out}");
        assert!(out.elapsed >= 14 * SECOND - SECOND / 10, "{out}");
        assert!(out.last_line().contains("no request arrived for "), "{out}");
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn hold_follows_the_messages_of_a_tcp_stream_not_only_its_start() {
    // One tcp_proxy connection carrying a message every 300 ms: every message is an arrival, in
    // the socket table as in the count (bytes received), though /clusters counts the stream once.
    scenario(|bin| {
        use std::io::Write;
        let _app = App::start(APP, false);
        let _envoy = start(&bin);
        let outside = support::netns::outside();
        let hold = holding("1s", "15s");
        let mut stream =
            outside.enter(|| std::net::TcpStream::connect(from_outside(3306)).unwrap());
        let until = Instant::now() + 4 * SECOND;
        let mut last = Instant::now();
        // Bounded by time and by count.
        for _ in 0..100 {
            if Instant::now() >= until {
                break;
            }
            last = Instant::now();
            stream.write_all(b"GET /ok HTTP/1.1\r\nhost: app\r\n\r\n").unwrap();
            std::thread::sleep(3 * SECOND / 10);
        }
        let out = hold.finish();
        drop(stream);
        returned_a_quiet_time_after(&out, last);
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn hold_reads_the_socket_table_alone_once_envoy_cannot_answer_and_says_so() {
    // Envoy gone: /clusters fails, the socket table shows nothing arriving (nothing can, with no
    // proxy in front of the app), and the hold returns after its quiet time.
    scenario(|bin| {
        let _app = App::start(APP, false);
        let mut envoy = start(&bin);
        envoy.kill();
        let out = holding("0s", "10s").finish();
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            out.stderr.contains("/clusters: ")
                && out.stderr.contains("; arrivals from the socket table alone"),
            "the failure and what the hold reads instead are told {out}"
        );
        assert!(
            out.last_line().contains(": no request arrived for 1.0s, 0 active connections (proc)"),
            "{out}"
        );
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn a_drain_that_got_no_answer_is_sent_again_so_keep_alive_clients_still_hear_connection_close() {
    scenario(|bin| {
        let _app = App::start(APP, false);
        let envoy = start(&bin);
        let mut idle = Conn::open(INBOUND).unwrap();
        assert_eq!(idle.get("/ok").unwrap().status, 200);
        // Envoy stalls (a starved node): the drain gets no answer within its second.
        envoy.signal(libc::SIGSTOP);
        let mut hook = spawn(command(&["run", "--min-drain", "4s", "--deadline", "10s"]));
        hook.expect_line("failed to drain listeners", 5 * SECOND);
        envoy.signal(libc::SIGCONT);
        hook.expect_line("Envoy accepted the drain", 5 * SECOND);
        let resp = idle.get("/ok").expect("an answer");
        assert!(resp.says_close(), "the drain sent again reaches the keep-alive client {resp:?}");
        let out = hook.finish();
        assert_eq!(out.code, Some(0), "{out}");
        assert!(out.stderr.contains("; sending it again before each count"), "{out}");
    });
}

/// A server on a Unix socket that answers every request `200 hello, world`, as anything but Envoy
/// would: no `server: envoy` header.
struct Impostor {
    path: PathBuf,
    server: Option<std::thread::JoinHandle<()>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Impostor {
    fn start(dir: &Path) -> Impostor {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("admin.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        let server = std::thread::spawn(move || {
            // At most one connection a count for a minute; `drop` wakes the accept to stop it.
            for conn in listener.incoming().take(1000) {
                let Ok(mut conn) = conn else { continue };
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                conn.set_read_timeout(Some(SECOND)).unwrap();
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    match conn.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => break,
                    }
                }
                let _ =
                    conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello, world");
            }
        });
        Impostor { path, server: Some(server), stop }
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = std::os::unix::net::UnixStream::connect(&self.path);
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn what_answers_on_the_admin_socket_unlike_envoy_is_never_taken_for_envoy() {
    // An impostor of Envoy's user on the socket `--admin` names, Envoy on its TCP port with a
    // request in flight: the impostor holds none of Envoy's connections, so taking it for Envoy
    // counted 0 and ended the wait under the request.
    scenario(|bin| {
        let app = App::start(APP, true);
        let _envoy = start(&bin);
        let dir = std::env::temp_dir().join(format!("envoy-drain-impostor-{}", std::process::id()));
        let impostor = Impostor::start(&dir);
        let admin = format!("unix:{}", impostor.path.display());
        let request = in_flight(INBOUND, "/delay/2");
        app.wait_received(1, 10 * SECOND);
        let out = run(command(&[
            "run",
            "--admin",
            &admin,
            "--min-drain",
            "0s",
            "--interval",
            "100ms",
            "--deadline",
            "10s",
        ]));
        drop(impostor);
        let answered = app.wait_answered(10 * SECOND);
        let (resp, _) = request.join().unwrap().expect("the request completes");
        assert_eq!(resp.status, 200, "{resp:?}");
        assert_eq!(out.code, Some(0), "{out}");
        assert!(out.ended >= answered, "ended while the request was in flight {out}");
        assert!(
            out.stderr.contains("failed to drain listeners")
                && out.stderr.contains("answered 200 without Envoy's 'server: envoy' header"),
            "{out}"
        );
        assert!(
            out.stderr.contains(&format!(
                "what listens on Envoy's admin address {admin} is not taken as Envoy (answered \
                 200 without Envoy's 'server: envoy' header)"
            )),
            "{out}"
        );
    });
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn a_count_that_waited_on_a_stopped_envoy_does_not_space_the_counts() {
    // The time a request waits on an Envoy that does not run is not its main thread's: pacing
    // on it spaced the counts 20 s apart and held the hook long after the last response.
    scenario(|bin| {
        let app = App::start(APP, true);
        let envoy = start(&bin);
        let request = in_flight(INBOUND, "/delay/4");
        app.wait_received(1, 10 * SECOND);
        let mut hook = spawn(command(&["run", "--min-drain", "0s", "--deadline", "30s"]));
        hook.expect_line("1 active connection (stats)", 5 * SECOND);
        envoy.signal(libc::SIGSTOP);
        hook.expect_line("stats unavailable", 5 * SECOND);
        envoy.signal(libc::SIGCONT);
        let (resp, answered) = request.join().unwrap().expect("the request completes");
        assert_eq!(resp.status, 200, "{resp:?}");
        let out = hook.finish();
        assert_eq!(out.code, Some(0), "{out}");
        let after = out.ended.saturating_duration_since(answered);
        assert!(
            out.ended >= answered && after < 2 * SECOND,
            "ended {after:?} after the last response {out}"
        );
    });
}

/// A gateway's route to a backend whose endpoints come over EDS, as istiod pushes them: here from
/// a file Envoy watches (`path_config_source`: a new one moved into `dir` is a push), on a
/// listener of its own (8444).
fn eds_gateway(dir: &Path) -> String {
    let file = dir.join("eds.yaml");
    format!(
        "
node: {{ id: router~10.0.0.1~gateway-0.default~default.svc.cluster.local, cluster: gateway.default }}
static_resources:
  clusters:
  - name: outbound|80||backend.default.svc.cluster.local
    type: EDS
    connect_timeout: 1s
    eds_cluster_config:
      service_name: backend
      eds_config:
        resource_api_version: V3
        path_config_source: {{ path: {}, watched_directory: {{ path: {} }} }}
  listeners:
  - name: gateway
    address: {{ socket_address: {{ address: 0.0.0.0, port_value: 8444 }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          '@type': type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          route_config:
            virtual_hosts:
            - name: backend
              domains: ['*']
              routes:
              - match: {{ prefix: / }}
                route: {{ cluster: outbound|80||backend.default.svc.cluster.local, timeout: 60s }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{ '@type': type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
",
        file.display(),
        dir.display()
    )
}

/// Pushes the backend's endpoints (`ip:port`) to `eds_gateway`'s Envoy: a new file moved in.
fn push_endpoints(dir: &Path, version: u32, endpoints: &[&str]) {
    let lb: String = (endpoints.iter())
        .map(|e| {
            let (ip, port) = e.rsplit_once(':').unwrap();
            format!("    - endpoint: {{ address: {{ socket_address: {{ address: {ip}, port_value: {port} }} }} }}\n")
        })
        .collect();
    let body = format!(
        "version_info: '{version}'\nresources:\n- '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\n  cluster_name: backend\n  endpoints:\n  - lb_endpoints:\n{lb}"
    );
    let body = if endpoints.is_empty() {
        body.replace("  - lb_endpoints:\n", "  - lb_endpoints: []\n")
    } else {
        body
    };
    std::fs::write(dir.join("eds.next"), body).unwrap();
    std::fs::rename(dir.join("eds.next"), dir.join("eds.yaml")).unwrap();
}

#[test]
#[ignore = "needs root and Envoy: `bash scripts/test` runs it"]
fn a_request_to_a_backend_that_eds_removed_holds_a_count_of_requests_until_it_is_answered() {
    // Red-team of run, finding 3: istiod drops a terminating endpoint from every proxy's EDS at
    // once (pilot/pkg/xds/endpoints/endpoint_builder.go, "Filter out terminating endpoints");
    // /clusters then lists no host for the request Envoy still proxies to it, and a gateway's
    // hook (`--drain all --count requests`) said "0 active requests" and let Envoy stop under a
    // 6 s request. The client's connection still awaits its answer: the hook waits for it.
    scenario(|bin| {
        let app = App::start(APP, false);
        let dir = std::env::temp_dir().join(format!("envoy-drain-eds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        push_endpoints(&dir, 1, &[APP]);
        let yaml = eds_gateway(&dir);
        // Istio's stats: no downstream_* gauges, so requests come from /clusters.
        let merge = vec!["tests/envoy/no-connection-stats.yaml"];
        let mut envoy = Envoy::start(&bin, EnvoyOptions { yaml, merge, ..EnvoyOptions::default() });
        let request = in_flight("127.0.0.1:8444", "/delay/6");
        app.wait_received(1, 10 * SECOND);
        let args = ["run", "--drain", "all", "--count", "requests", "--min-drain", "1s"];
        let hook = spawn(command(&[&args[..], &["--deadline", "20s"]].concat()));
        push_endpoints(&dir, 2, &[]);
        let out = hook.finish();
        // What the agent does once the hook returns: Envoy stops.
        envoy.kill();
        let answer = request.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(answer.map(|(r, _)| r.status).ok(), Some(200), "{out}");
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            out.stderr.contains("0 active requests (clusters), 1 connection awaiting one"),
            "{out}"
        );
    });
}
