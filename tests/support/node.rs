//! Real Kubernetes nodes for a test's control plane (cluster.rs): the kubelet, containerd with
//! runc and the CNI plugins bridge, host-local and loopback, and kube-proxy in iptables mode, all
//! built from their sources by scripts/components. They run in the control plane's network
//! namespace, which is the node's own network (10.0.0.1 on eth0); pods get 10.244.0.0/24 on the
//! bridge cni0 and their own namespaces, as on any node; Services' cluster IPs are kube-proxy's
//! rules in the node's namespace. Images are made here from the machine's own files (no registry
//! is reached) and imported into containerd.
//!
//! What this machine asks of them (each a setting of theirs, not a change of their code): it has
//! cgroup v1 only, which the kubelet refuses from 1.35 unless told (`failCgroupV1: false`,
//! pkg/kubelet/apis/config/validation/validation_linux.go); its root lacks CAP_SYS_RESOURCE, so
//! containerd must not lower a container's OOM score below its own (`restrict_oom_score_adj`,
//! which containerd offers for the same case in rootless setups); and the node's cgroups live
//! under a root of their own (`cgroupRoot`), removed at the end.
//!
//! More nodes (`start_nodes`): node-1 as above, node-<n> with a network namespace of its own and
//! its eth0 at 10.0.0.<n>, every node's eth0 on one bridge (in a namespace of its own, the
//! switch), its pods on 10.244.<n-1>.0/24 and a route to each other node's pods through that
//! node, as a cluster's pod network routes them (the control plane stays node-1's, reached at
//! 10.0.0.1). Each node has its own containerd, kubelet and kube-proxy, so a Service's rules on
//! one node send its traffic to pods on another.
//!
//! Drop stops the kubelet, kills every process in the node's cgroups and containerd's shims,
//! unmounts what they mounted (rootfs, volumes, the pods' network namespaces) and removes the
//! cgroups and the files, also when the test failed.

use super::cluster::{ControlPlane, KUBE_PROXY_TOKEN, KUBELET_TOKEN, MAX_NODES};
use super::netns::Netns;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const NODE_IP: &str = "10.0.0.1";
const CGROUP_CONTROLLERS: [&str; 9] =
    ["systemd", "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids"];

/// An image for the node: `files` copied from this machine to the same paths, and `extra`
/// (content, path in the image), each program with the libraries it loads (`ldd`).
pub struct Image {
    pub name: &'static str,
    pub entrypoint: Vec<String>,
    pub files: Vec<String>,
    pub extra: Vec<(PathBuf, String)>,
}

pub struct Node<'a> {
    cp: &'a ControlPlane,
    /// node-<n>, at 10.0.0.<n>.
    n: u8,
    /// Its own network namespace; node-1's is the control plane's (`None`).
    netns: Option<Netns>,
    /// node-1's, with more nodes: the namespace of the bridge the nodes' eth0 join.
    switch: Option<Netns>,
    /// Its own mount namespace, node-1's directory showing this node's (`None` for node-1).
    mounts: Option<OwnedFd>,
    dir: PathBuf,
    cgroup: String,
    processes: Vec<Child>,
    containerd: u32,
}

impl<'a> Node<'a> {
    /// Starts the node's components and imports `images`; returns once the node is Ready.
    pub fn start(cp: &'a ControlPlane, images: &[Image]) -> Node<'a> {
        sweep_stale();
        Node::start_nth(cp, 1, images, None)
    }

    /// Nodes node-1 to node-`count`, one after the other, then the routes between their pods.
    pub fn start_nodes(cp: &'a ControlPlane, count: u8, images: &[Image]) -> Vec<Node<'a>> {
        assert!((1..=MAX_NODES).contains(&count), "1 to {MAX_NODES} nodes");
        sweep_stale();
        let mut nodes = vec![Node::start_nth(cp, 1, images, None)];
        if count > 1 {
            let switch = nodes[0].switch();
            nodes.extend((2..=count).map(|n| Node::start_nth(cp, n, images, Some(&switch))));
            nodes[0].switch = Some(switch);
        }
        for node in &nodes {
            for other in nodes.iter().filter(|o| o.n != node.n) {
                let via = format!("10.244.{}.0/24 via {}", other.n - 1, other.ip());
                node.ip_command(&format!("route add {via}"));
            }
        }
        nodes
    }

    fn start_nth(
        cp: &'a ControlPlane,
        n: u8,
        images: &[Image],
        switch: Option<&Netns>,
    ) -> Node<'a> {
        let (name, pid) =
            (if n == 1 { "node".to_string() } else { format!("node-{n}") }, std::process::id());
        let dir = PathBuf::from(cp.path(&name));
        // cni-bin: where a CNI plugin that a DaemonSet installs goes (istio-cni's).
        for sub in ["cni", "cni-bin"] {
            std::fs::create_dir_all(dir.join(sub)).expect("the node's directory");
        }
        let mut node = Node {
            cp,
            n,
            netns: (n > 1).then(Netns::new),
            switch: None,
            mounts: (n > 1).then(|| own_view(&PathBuf::from(cp.path("node")), &dir)),
            cgroup: if n == 1 {
                format!("envoy-drain-node-{pid}")
            } else {
                format!("envoy-drain-node-{pid}-{n}")
            },
            dir,
            processes: Vec::new(),
            containerd: 0,
        };
        for c in CGROUP_CONTROLLERS {
            std::fs::create_dir_all(format!("/sys/fs/cgroup/{c}/{}", node.cgroup))
                .unwrap_or_else(|e| panic!("NOT RUN: the node's cgroup in {c}: {e}"));
        }
        node.network(switch);
        node.containerd();
        for image in images {
            node.import(image);
        }
        node.kubelet();
        let name = node.name();
        cp.wait_for(&format!("{name} to be Ready"), || {
            let ready = cp.kubectl(&[
                "get",
                "node",
                &name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ]);
            (ready.stdout.trim() == "True").then_some(())
        });
        node
    }

    /// `node-<n>`.
    pub fn name(&self) -> String {
        format!("node-{}", self.n)
    }

    /// Its address: 10.0.0.<n>.
    pub fn ip(&self) -> String {
        format!("10.0.0.{}", self.n)
    }

    /// `program` to run in the node's network namespace, and its mount namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = match &self.netns {
            Some(netns) => netns.command(program),
            None => self.cp.command(program),
        };
        if let Some(mounts) = &self.mounts {
            let fd = mounts.as_raw_fd();
            // SAFETY: between fork and exec, setns on a descriptor the child inherited.
            unsafe {
                cmd.pre_exec(move || match libc::setns(fd, libc::CLONE_NEWNS) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                });
            }
        }
        cmd
    }

    /// A path in the node's directory as its own processes see it: under node-1's directory,
    /// which shows this node's in its mount namespace.
    pub fn seen(&self, name: &str) -> String {
        match self.n {
            1 => self.path(name),
            _ => self.cp.path("node") + "/" + name,
        }
    }

    fn ip_command(&self, args: &str) {
        ip(self.command("ip"), args, &self.name());
    }

    /// eth0 at the node's address, and forwarding on (pods reach other nodes through it). Other
    /// nodes' eth0 are veths whose peers join the bridge `nodes0` in `switch`, a namespace of its
    /// own: a bridge in a node's namespace would show the node's iptables (kube-proxy's) every
    /// frame between two other nodes, and its conntrack each reply twice.
    fn network(&self, switch: Option<&Netns>) {
        let first = match (&self.netns, switch) {
            (Some(netns), Some(switch)) => {
                let (port, peer) = (format!("port-{}", self.n), format!("eth0-{}", self.n));
                let on_switch = |args: &str| ip(switch.command("ip"), args, "the switch");
                on_switch(&format!("link add {port} type veth peer name {peer}"));
                on_switch(&format!("link set {peer} netns {}", netns.path()));
                on_switch(&format!("link set {port} master nodes0 up"));
                format!("link set {peer} name eth0")
            }
            _ => "link add eth0 type veth peer name eth0-peer".to_string(),
        };
        let ip = self.ip();
        for args in [
            first.as_str(),
            &format!("addr add {ip}/24 dev eth0"),
            "link set eth0 up",
            "route add default dev eth0",
        ] {
            self.ip_command(args);
        }
        if self.netns.is_none() {
            self.ip_command("link set eth0-peer up");
        }
        let forward = self.command("sysctl").args(["-qw", "net.ipv4.ip_forward=1"]).status();
        assert!(forward.is_ok_and(|s| s.success()), "forwarding on {}", self.name());
    }

    /// The switch the other nodes join: node-1's eth0-peer moved into a namespace of its own and
    /// put on the bridge `nodes0` there.
    fn switch(&self) -> Netns {
        let switch = Netns::new();
        self.ip_command(&format!("link set eth0-peer netns {}", switch.path()));
        for args in [
            "link add nodes0 type bridge",
            "link set eth0-peer master nodes0 up",
            "link set nodes0 up",
        ] {
            ip(switch.command("ip"), args, "the switch");
        }
        switch
    }

    /// A path in the node's directory (removed with the node).
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().expect("a UTF-8 temporary path").to_string()
    }

    /// The API server as node-1 reaches it, on loopback; another node at node-1's address, the
    /// certificate still checked for the name it holds.
    fn kubeconfig(&self, name: &str, token: &str) -> String {
        let path = self.path(&format!("{name}.kubeconfig"));
        let server = match self.n {
            1 => "https://localhost:6443".to_string(),
            _ => format!("https://{NODE_IP}:6443\n    tls-server-name: localhost"),
        };
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: \
                 {server}\n    certificate-authority: {}\nusers:\n- name: {name}\n  \
                 user:\n    token: {token}\ncontexts:\n- name: test\n  context:\n    cluster: \
                 test\n    user: {name}\ncurrent-context: test\n",
                self.cp.path("pki/apiserver.crt")
            ),
        )
        .expect("a kubeconfig");
        path
    }

    /// Starts `program` of components/bin with the components on PATH (containerd runs runc and
    /// its shim from there), its output in `<node>/<program>.log`.
    fn spawn(&mut self, program: &str, args: &[&str]) {
        let log = std::fs::File::create(self.log(program)).expect("a log");
        let path =
            format!("{}:{}", self.cp.bin("").display(), std::env::var("PATH").unwrap_or_default());
        let child = self
            .command(self.cp.bin(program).to_str().expect("UTF-8"))
            .args(args)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("NOT RUN: {program}: {e}"));
        self.processes.push(child);
    }

    fn containerd(&mut self) {
        let config = format!(
            "version = 3\nroot = \"{root}\"\nstate = \"{state}\"\n[grpc]\n  address = \
             \"{socket}\"\n[plugins.'io.containerd.cri.v1.runtime']\n  restrict_oom_score_adj = \
             true\n  netns_mounts_under_state_dir = true\n  [plugins.'io.containerd.cri.v1.runtime'.cni]\n    bin_dirs = [\"{bin}\", \"{own_bin}\"]\n    \
             conf_dir = \"{cni}\"\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  \
             sandbox = \"localhost/pause:test\"\n",
            // Seen paths: the pods' network namespaces are named by them (`seen`).
            root = self.seen("containerd/root"),
            state = self.seen("containerd/state"),
            socket = self.path("containerd.sock"),
            bin = self.cp.bin("").display(),
            own_bin = self.path("cni-bin"),
            cni = self.path("cni"),
        );
        std::fs::write(self.dir.join("containerd.toml"), config).expect("containerd's config");
        std::fs::write(
            self.dir.join("cni/10-pods.conflist"),
            format!(
                r#"{{"cniVersion":"1.0.0","name":"pods","plugins":[{{"type":"bridge","bridge":"cni0","isGateway":true,"ipam":{{"type":"host-local","ranges":[[{{"subnet":"10.244.{}.0/24"}}]],"routes":[{{"dst":"0.0.0.0/0"}}],"dataDir":"{}"}}}},{{"type":"loopback"}}]}}"#,
                self.n - 1,
                self.path("ipam")
            ),
        )
        .expect("the CNI configuration");
        let config = self.path("containerd.toml");
        self.spawn("containerd", &["--config", &config]);
        self.containerd = self.processes.last().map_or(0, Child::id);
        let socket = self.dir.join("containerd.sock");
        self.cp.wait_for("containerd's socket", || socket.exists().then_some(()));
        self.import(&Image {
            name: "localhost/pause:test",
            entrypoint: vec!["/pause".into()],
            files: vec![],
            extra: vec![(self.cp.bin("pause"), "/pause".into())],
        });
    }

    /// Makes `image` (an OCI image layout of one layer) and imports it into containerd's
    /// namespace for Kubernetes.
    pub fn import(&self, image: &Image) {
        let work = self.dir.join("images").join(image.name.replace(['/', ':'], "_"));
        let root = work.join("rootfs");
        fill_root(&root, image);
        let layer = work.join("layer.tar");
        let ok = Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(&root)
            .arg("-cf")
            .arg(&layer)
            .arg(".")
            .status()
            .expect("tar");
        assert!(ok.success(), "tar of {}", image.name);
        let archive = oci_archive(&work, &layer, image);
        let socket = self.path("containerd.sock");
        let out = self
            .cp
            .command(self.cp.bin("ctr").to_str().expect("UTF-8"))
            .args(["--address", &socket, "--namespace", "k8s.io", "images", "import"])
            .arg(&archive)
            .output()
            .expect("ctr");
        assert!(out.status.success(), "ctr images import {}: {out:?}", image.name);
        let _ = std::fs::remove_dir_all(&work);
    }

    /// The kubelet's own API is open (anonymous, always allowed): only the test's namespace
    /// reaches it.
    fn kubelet(&mut self) {
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             failCgroupV1: false\nfailSwapOn: false\ncgroupDriver: cgroupfs\ncgroupRoot: /{}\n\
             enforceNodeAllocatable: []\ncontainerRuntimeEndpoint: unix://{}\n\
             authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}\n\
             authorization: {{mode: AlwaysAllow}}\npodLogsDir: {}\nresolvConf: \"\"\n\
             readOnlyPort: 0\nhealthzPort: 0\nlocalStorageCapacityIsolation: false\n\
             evictionHard: {{}}\nimageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n",
            self.cgroup,
            self.path("containerd.sock"),
            self.path("pod-logs"),
        );
        std::fs::write(self.dir.join("kubelet.yaml"), config).expect("the kubelet's config");
        let token = match self.n {
            1 => KUBELET_TOKEN.to_string(),
            n => format!("{KUBELET_TOKEN}-{n}"),
        };
        let kubeconfig = self.kubeconfig("kubelet", &token);
        let (hostname, node_ip) =
            (format!("--hostname-override={}", self.name()), format!("--node-ip={}", self.ip()));
        let (config, root) = (self.path("kubelet.yaml"), self.path("kubelet"));
        self.spawn(
            "kubelet",
            &[
                &format!("--kubeconfig={kubeconfig}"),
                &format!("--config={config}"),
                &format!("--root-dir={root}"),
                &hostname,
                &node_ip,
                // Its probes' failures, which explain a lost request (rollout.rs).
                "--v=1",
            ],
        );
        let kubeconfig = self.kubeconfig("kube-proxy", KUBE_PROXY_TOKEN);
        self.spawn(
            "kube-proxy",
            &[
                &format!("--kubeconfig={kubeconfig}"),
                &hostname,
                "--proxy-mode=iptables",
                "--cluster-cidr=10.244.0.0/16",
                // The conntrack table's size is the machine's, not a namespace's to set.
                "--conntrack-max-per-core=0",
            ],
        );
    }

    /// Where the kubelet writes the containers' logs: <namespace>_<pod>_<uid>/<container>/0.log.
    pub fn pod_logs(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }

    /// The last lines of a node component's log.
    pub fn log_tail(&self, program: &str, lines: usize) -> String {
        super::cluster::tail(&self.log(program), lines)
    }

    /// A node component's log file.
    pub fn log(&self, program: &str) -> PathBuf {
        self.dir.join(format!("{program}.log"))
    }
}

impl Drop for Node<'_> {
    fn drop(&mut self) {
        // The kubelet and kube-proxy first (nothing restarts a container then), containerd last.
        let socket = self.path("containerd.sock");
        for mut p in std::mem::take(&mut self.processes).into_iter().rev() {
            if p.id() == self.containerd {
                remove(&self.cgroup, &self.dir, &socket);
            }
            let _ = p.kill();
            let _ = p.wait();
        }
        remove(&self.cgroup, &self.dir, &socket);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Kills every process of the node's cgroups and every shim of its containerd, then removes the
/// cgroups (each waits, within a bound, for its processes to be gone).
fn remove(cgroup: &str, dir: &Path, socket: &str) {
    for pid in shims(socket) {
        // SAFETY: a signal to a process of this node.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let pids = format!("/sys/fs/cgroup/pids/{cgroup}");
    for group in groups(Path::new(&pids)) {
        for pid in std::fs::read_to_string(group.join("cgroup.procs")).unwrap_or_default().lines() {
            if let Ok(pid) = pid.parse::<i32>() {
                // SAFETY: a signal to a process of this node's cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    unmount_under(dir);
    // Every hierarchy: runc also makes the pods' cgroups in the cgroup v2 one that a hybrid
    // machine like this mounts at /sys/fs/cgroup/unified.
    let hierarchies = std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten();
    for h in hierarchies {
        let until = Instant::now() + Duration::from_secs(5);
        let top = h.path().join(cgroup);
        let mut all = groups(&top);
        all.reverse();
        for group in all {
            while std::fs::remove_dir(&group).is_err() && group.exists() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// `top` and every cgroup under it, parents before children.
fn groups(top: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    let mut next = vec![top.to_path_buf()];
    while let Some(g) = next.pop() {
        if let Ok(entries) = std::fs::read_dir(&g) {
            next.extend(entries.flatten().filter(|e| e.path().is_dir()).map(|e| e.path()));
            all.push(g);
        }
    }
    all.sort_by_key(|p| p.components().count());
    all
}

/// The shims containerd at `socket` started (they outlive it, as they are meant to).
fn shims(socket: &str) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    if socket.is_empty() {
        return Vec::new();
    }
    procs
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let ours = args.first()?.ends_with(b"containerd-shim-runc-v2")
                && args.contains(&socket.as_bytes());
            ours.then_some(pid)
        })
        .collect()
}

/// Detaches every mount under `dir`, the deepest first.
fn unmount_under(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.to_str().unwrap_or_default();
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| !prefix.is_empty() && p.starts_with(prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let Ok(c) = std::ffi::CString::new(p) else { continue };
        // SAFETY: a NUL-terminated path; MNT_DETACH only detaches.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// What a test process killed before its Drop ran left behind: the cgroups, shims and mounts of
/// a node whose process is gone.
fn sweep_stale() {
    let hierarchies = std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten();
    let mut names: Vec<String> = hierarchies
        .flat_map(|h| std::fs::read_dir(h.path()).into_iter().flatten().flatten())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        // envoy-drain-node-<pid>, or -<pid>-<n> for node-<n>.
        let Some(rest) = name.strip_prefix("envoy-drain-node-") else { continue };
        let pid = rest.split('-').next().unwrap_or(rest);
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dirs = std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten();
        for d in dirs.filter(|d| d.file_name().to_string_lossy().ends_with(&format!("-{pid}"))) {
            let nodes = std::fs::read_dir(d.path()).into_iter().flatten().flatten();
            for node in nodes.filter(|e| e.file_name().to_string_lossy().starts_with("node")) {
                let node = node.path();
                remove(&name, &node, &node.join("containerd.sock").to_string_lossy());
            }
            let _ = std::fs::remove_dir_all(d.path());
        }
        remove(&name, Path::new(""), "");
    }
}

/// A mount namespace of the machine's mounts, none shared with it, where `node_1`'s directory
/// shows `dir` (every mount under it too): made on a thread of its own, which leaves it.
fn own_view(node_1: &Path, dir: &Path) -> OwnedFd {
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("a path");
    let (from, to, root) = (c(dir), c(node_1), c(Path::new("/")));
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: this thread's own file system context and mount namespace; plain C strings.
            unsafe {
                assert_eq!(
                    libc::unshare(libc::CLONE_FS | libc::CLONE_NEWNS),
                    0,
                    "NOT RUN: unshare"
                );
                let private = libc::MS_REC | libc::MS_PRIVATE;
                let none = std::ptr::null();
                assert_eq!(libc::mount(none, root.as_ptr(), none, private, none.cast()), 0);
                let bind = libc::MS_BIND | libc::MS_REC;
                let bound = libc::mount(from.as_ptr(), to.as_ptr(), none, bind, none.cast());
                assert_eq!(
                    bound,
                    0,
                    "{dir:?} over {node_1:?}: {}",
                    std::io::Error::last_os_error()
                );
                let fd = libc::open(
                    c"/proc/thread-self/ns/mnt".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                );
                assert!(fd >= 0, "the node's mount namespace");
                OwnedFd::from_raw_fd(fd)
            }
        })
        .join()
        .expect("the node's mount namespace")
    })
}

/// `ip <args>` run by `cmd` (on `node`), which must succeed.
fn ip(mut cmd: Command, args: &str, node: &str) {
    let ok = cmd.args(args.split(' ')).status().expect("iproute2's ip");
    assert!(ok.success(), "ip {args} on {node}");
}

/// `image`'s files in `root`, each program with the libraries it loads, as `ldd` names them.
fn fill_root(root: &Path, image: &Image) {
    std::fs::create_dir_all(root.join("tmp")).expect("the image's root");
    let copy = |from: &Path, to: &str| {
        let target = root.join(to.trim_start_matches('/'));
        std::fs::create_dir_all(target.parent().expect("a parent")).expect("a directory");
        let ok = Command::new("cp").arg("-a").arg(from).arg(&target).status().expect("cp");
        assert!(ok.success(), "cp {} {}", from.display(), target.display());
    };
    let with_libraries = |from: &Path, to: &str| {
        copy(from, to);
        let ldd = Command::new("ldd").arg(from).output().expect("ldd");
        for lib in String::from_utf8_lossy(&ldd.stdout).split_whitespace() {
            if lib.starts_with('/') {
                let real = std::fs::canonicalize(lib).expect("a library");
                copy(&real, lib);
            }
        }
    };
    for file in &image.files {
        with_libraries(Path::new(file), file);
    }
    for (from, to) in &image.extra {
        with_libraries(&std::fs::canonicalize(from).expect("an image's file"), to);
    }
}

/// An OCI image layout of `layer` with `image`'s name and entrypoint, archived in `work` as
/// containerd imports one: its path.
fn oci_archive(work: &Path, layer: &Path, image: &Image) -> std::path::PathBuf {
    let layout = work.join("layout");
    std::fs::create_dir_all(layout.join("blobs/sha256")).expect("the layout");
    let blob = |bytes: Vec<u8>| -> (String, usize) {
        let path = work.join("blob");
        std::fs::write(&path, &bytes).expect("a blob");
        let sum = Command::new("sha256sum").arg(&path).output().expect("sha256sum");
        let digest = String::from_utf8_lossy(&sum.stdout)[..64].to_string();
        std::fs::rename(&path, layout.join("blobs/sha256").join(&digest)).expect("a blob");
        (format!("sha256:{digest}"), bytes.len())
    };
    let (layer_digest, layer_size) = blob(std::fs::read(layer).expect("the layer"));
    let entrypoint: Vec<String> =
        image.entrypoint.iter().map(|a| super::cluster::json_string(a)).collect();
    let (config, config_size) = blob(
        format!(
            r#"{{"architecture":"amd64","os":"linux","config":{{"Entrypoint":[{}]}},"rootfs":{{"type":"layers","diff_ids":["{layer_digest}"]}}}}"#,
            entrypoint.join(",")
        )
        .into_bytes(),
    );
    let (manifest, manifest_size) = blob(
        format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config}","size":{config_size}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer_digest}","size":{layer_size}}}]}}"#
        )
        .into_bytes(),
    );
    std::fs::write(
        layout.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{manifest}","size":{manifest_size},"annotations":{{"io.containerd.image.name":"{}"}}}}]}}"#,
            image.name
        ),
    )
    .expect("the index");
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
        .expect("oci-layout");
    let archive = work.join("image.tar");
    let ok = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .args(["oci-layout", "index.json", "blobs"])
        .status()
        .expect("tar");
    assert!(ok.success(), "tar of {}'s layout", image.name);
    archive
}
