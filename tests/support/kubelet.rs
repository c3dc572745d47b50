//! A stand-in for the kubelet deleting a pod of the replica (support/pod.rs), in either of its
//! orderings (kubelet pkg/kubelet/kuberuntime/kuberuntime_container.go killContainer and
//! kuberuntime_termination_order.go; KEP-753; see docs/how-it-works.md):
//! - classic sidecar (istio-proxy among the containers): at deletion, every container's preStop
//!   starts, and a container without one gets SIGTERM; a container gets SIGTERM when its own
//!   preStop has returned, whatever the others do;
//! - native sidecar (istio-proxy an init container with `restartPolicy: Always`): the preStops
//!   start at deletion too, but the sidecar gets SIGTERM only when its preStop has returned AND
//!   the app has exited; what is left of the grace period then, at least 2 s, is its stop time.
//!
//! At the end of the grace period whatever still runs is killed (SIGKILL), the hooks included.
//! A pod without a sidecar (ambient mode, or no mesh) has only the app's container.

use super::pod::{APP_UID, DataPlane, Network, Pod};
use super::running::{Finished, spawn};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as Atomic};
use std::thread;
use std::time::{Duration, Instant};

/// Kubernetes' default terminationGracePeriodSeconds.
pub const GRACE: Duration = Duration::from_secs(30);
/// The least stop time the kubelet gives a native sidecar after waiting for the app.
const NATIVE_FLOOR: Duration = Duration::from_secs(2);

/// The proxy container's preStop.
#[derive(Debug, Clone)]
pub enum ProxyPreStop {
    None,
    /// Istio's native-sidecar preStop, `pilot-agent request POST drain`: the agent's /drain.
    AgentDrain,
    /// envoy-drain with these arguments.
    Hook(Vec<String>),
}

/// The app container's preStop.
#[derive(Debug, Clone)]
pub enum AppPreStop {
    None,
    /// A `sleep` (Kubernetes' sleep action, or `sleep N` in the image).
    Sleep(Duration),
    /// envoy-drain with these arguments, as the app's user: `hold`.
    Hook(Vec<String>),
}

/// When each thing happened.
pub struct Deletion {
    pub deleted: Instant,
    pub app_exited: Instant,
    pub proxy_stopped: Instant,
    /// The envoy-drain hook's run, when the proxy had one.
    pub hook: Option<Finished>,
    /// The app's envoy-drain preStop, when it had one.
    pub app_hook: Option<Finished>,
}

impl Deletion {
    /// Every container has exited.
    pub fn pod_gone(&self) -> Instant {
        self.app_exited.max(self.proxy_stopped)
    }
}

/// Deletes `pod`: its app gets SIGTERM once `app_pre_stop` has returned, its proxy runs
/// `pre_stop` and gets SIGTERM as its kind of sidecar says (classic or native).
pub fn delete(
    pod: &Pod,
    pre_stop: &ProxyPreStop,
    app_pre_stop: &AppPreStop,
    grace: Duration,
) -> Deletion {
    let deleted = Instant::now();
    let end = deleted + grace;
    let app = pod.app().expect("a pod with an app");
    thread::scope(|s| {
        let app_exited = s.spawn(|| {
            let hook = match app_pre_stop {
                AppPreStop::None => None,
                &AppPreStop::Sleep(sleep) => {
                    thread::sleep(sleep.min(end.saturating_duration_since(Instant::now())));
                    None
                }
                AppPreStop::Hook(args) => {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    Some(spawn(pod.hook_as(APP_UID, APP_UID, &args)).finish_by(end))
                }
            };
            pod.sigterm_app();
            (app.wait_until(end).unwrap_or_else(|| app.kill()), hook)
        });
        let hook = match pre_stop {
            ProxyPreStop::None => None,
            ProxyPreStop::AgentDrain => {
                let _ = pod.inside(|| {
                    super::http::Conn::open("127.0.0.1:15020")
                        .and_then(|mut c| c.request("POST", "/drain"))
                });
                None
            }
            ProxyPreStop::Hook(args) => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Some(spawn(pod.hook(&args)).finish_by(end))
            }
        };
        let until = match pod.options.mesh {
            DataPlane::Sidecar { native: false } => end,
            DataPlane::Sidecar { native: true } => {
                app.wait_until(end);
                end.max(Instant::now() + NATIVE_FLOOR)
            }
            // No proxy container: what holds listeners in the pod (ambient's ztunnel) lets go of
            // them when the pod's sandbox goes, once the app has exited.
            _ => app.wait_until(end).unwrap_or(end),
        };
        let proxy_stopped = pod.sigterm_proxy(until);
        let (app_exited, app_hook) = app_exited.join().expect("the app's container");
        Deletion { deleted, app_exited, proxy_stopped, hook, app_hook }
    })
}

/// A readiness probe as the kubelet sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// tcpSocket: connect, then close at once, the kubelet first (kubelet pkg/probe/tcp/tcp.go),
    /// with SO_LINGER 1 s (pkg/probe/dialer_others.go): no socket of it stays in the pod.
    Tcp,
    /// httpGet: one GET with `Connection: close` (keep-alives off, pkg/probe/http/http.go), the
    /// answer read to its end: the app closes first and its end waits in TIME_WAIT.
    Http,
}

/// The kubelet's readiness probes of an app, from the node's network, until dropped.
pub struct Probes {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<usize>>,
}

impl Probes {
    /// Each of `kinds` from `from` to `target` every `period`, a new connection each.
    pub fn start(
        network: &Arc<Network>,
        from: &'static str,
        target: String,
        kinds: &'static [Probe],
        period: Duration,
    ) -> Probes {
        let stop = Arc::new(AtomicBool::new(false));
        let (network, stopped) = (Arc::clone(network), Arc::clone(&stop));
        let thread = thread::spawn(move || {
            network.client(|| {
                let mut sent = 0;
                // At most 10 minutes of probes, whatever happens to the test.
                let rounds =
                    (Duration::from_secs(600).as_millis() / period.as_millis().max(1)) as usize;
                for _ in 0..rounds {
                    if stopped.load(Atomic::SeqCst) {
                        break;
                    }
                    let next = Instant::now() + period;
                    for kind in kinds {
                        sent += usize::from(probe(*kind, from, &target));
                    }
                    thread::sleep(next.saturating_duration_since(Instant::now()));
                }
                sent
            })
        });
        Probes { stop, thread: Some(thread) }
    }

    /// Stops them; how many were answered.
    pub fn stop(mut self) -> usize {
        self.stop.store(true, Atomic::SeqCst);
        self.thread.take().map_or(0, |t| t.join().expect("the probes"))
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        self.stop.store(true, Atomic::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One probe; whether the app answered (a tcpSocket probe: whether it connected).
fn probe(kind: Probe, from: &str, target: &str) -> bool {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    let Ok(mut c) = super::pod::connect_from(from, target) else {
        return false;
    };
    let linger = libc::linger { l_onoff: 1, l_linger: 1 };
    super::pod::set_socket_option(c.as_raw_fd(), libc::SO_LINGER, &linger);
    match kind {
        Probe::Tcp => true,
        Probe::Http => {
            let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
            let request = b"GET /local/0?probe HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n";
            let mut answer = Vec::new();
            c.write_all(request).is_ok()
                && c.read_to_end(&mut answer).is_ok()
                && answer.starts_with(b"HTTP/1")
        }
    }
}
