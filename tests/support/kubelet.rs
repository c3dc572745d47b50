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

use super::pod::{APP_UID, Mesh, Pod};
use super::running::{Finished, spawn};
use std::thread;
use std::time::{Duration, Instant};

/// Kubernetes' default terminationGracePeriodSeconds.
pub const GRACE: Duration = Duration::from_secs(30);
/// The least stop time the kubelet gives a native sidecar after waiting for the app.
const NATIVE_FLOOR: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    Classic,
    Native,
}

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
/// `pre_stop` and gets SIGTERM as `ordering` says.
pub fn delete(
    pod: &Pod,
    ordering: Ordering,
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
        let until = match ordering {
            // No proxy container: what holds listeners in the pod (ambient's ztunnel) lets go of
            // them when the pod's sandbox goes, once the app has exited.
            _ if pod.options.mesh != Mesh::Sidecar => app.wait_until(end).unwrap_or(end),
            Ordering::Classic => end,
            Ordering::Native => {
                app.wait_until(end);
                end.max(Instant::now() + NATIVE_FLOOR)
            }
        };
        let proxy_stopped = pod.sigterm_proxy(until);
        let (app_exited, app_hook) = app_exited.join().expect("the app's container");
        Deletion { deleted, app_exited, proxy_stopped, hook, app_hook }
    })
}
