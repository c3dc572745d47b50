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

use super::pod::Pod;
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

/// When each thing happened.
pub struct Deletion {
    pub deleted: Instant,
    pub app_exited: Instant,
    pub proxy_stopped: Instant,
    /// The envoy-drain hook's run, when the proxy had one.
    pub hook: Option<Finished>,
}

impl Deletion {
    /// Every container has exited.
    pub fn pod_gone(&self) -> Instant {
        self.app_exited.max(self.proxy_stopped)
    }
}

/// Deletes `pod`: its app gets SIGTERM after `app_pre_stop` (a `sleep` preStop, when given), its
/// proxy runs `pre_stop` and gets SIGTERM as `ordering` says.
pub fn delete(
    pod: &Pod,
    ordering: Ordering,
    pre_stop: &ProxyPreStop,
    app_pre_stop: Option<Duration>,
    grace: Duration,
) -> Deletion {
    let deleted = Instant::now();
    let end = deleted + grace;
    let app = pod.app().expect("a pod with an app");
    thread::scope(|s| {
        let app_exited = s.spawn(|| {
            if let Some(sleep) = app_pre_stop {
                thread::sleep(sleep.min(end.saturating_duration_since(Instant::now())));
            }
            pod.sigterm_app();
            app.wait_until(end).unwrap_or_else(|| app.kill())
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
            Ordering::Classic => end,
            Ordering::Native => {
                app.wait_until(end);
                end.max(Instant::now() + NATIVE_FLOOR)
            }
        };
        let proxy_stopped = pod.sigterm_proxy(until);
        Deletion {
            deleted,
            app_exited: app_exited.join().expect("the app's container"),
            proxy_stopped,
            hook,
        }
    })
}
