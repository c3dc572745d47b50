//! Network namespaces of the test's own, so /proc/net/tcp shows only the test's sockets and any
//! port is free. They are anonymous: held by a file descriptor, they are gone once it is closed
//! and the processes started in them have exited, also when a test fails or is killed.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::thread;

/// Runs `f` on a new thread moved into a new network namespace with its loopback up. Sockets it
/// opens and processes it starts live there. A test that needs this fails loudly where the
/// namespace cannot be made (it needs root, as in CI): it never passes without having run.
pub fn in_private_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let worker = thread::spawn(move || {
        unshare_net();
        f()
    });
    worker.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Moves the calling thread into a new network namespace with its loopback up.
fn unshare_net() {
    // SAFETY: unshare affects only this thread, which owns nothing yet.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        panic!(
            "NOT RUN: cannot make a private network namespace ({}); this test needs root \
             (CAP_SYS_ADMIN), as the README's test command has in CI",
            std::io::Error::last_os_error()
        );
    }
    loopback_up();
}

/// A network namespace that threads and child processes can enter.
pub struct Netns {
    fd: OwnedFd,
}

impl Netns {
    /// A new namespace, its loopback up.
    pub fn new() -> Netns {
        let fd = thread::spawn(|| {
            unshare_net();
            let fd = std::fs::File::open("/proc/thread-self/ns/net")
                .expect("the new namespace's handle");
            OwnedFd::from(fd)
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Netns { fd }
    }

    /// The namespace process `pid` lives in (a pod's, say).
    pub fn of_process(pid: u32) -> std::io::Result<Netns> {
        let fd = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
        Ok(Netns { fd: OwnedFd::from(fd) })
    }

    /// Runs `f` on a thread inside the namespace. Threads it spawns stay inside.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let fd = self.fd.as_raw_fd();
        thread::scope(|s| {
            s.spawn(move || {
                join(fd);
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// A command that runs inside the namespace. It is killed when the thread that spawns it
    /// ends, so nothing outlives a test (a program that changes its user, as setpriv does, must
    /// set this again: `setpriv --pdeathsig SIGKILL`).
    pub fn command(&self, program: &str) -> Command {
        let fd = self.fd.as_raw_fd();
        let mut cmd = Command::new(program);
        // SAFETY: between fork and exec only async-signal-safe system calls run: setns on a
        // descriptor the child inherited, and prctl.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0
                    || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// A path naming the namespace, for `ip ... netns <path>`.
    pub fn path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.fd.as_raw_fd())
    }
}

/// This side of `outside()`'s veth pair: where clients outside the pod reach it.
pub const POD_SIDE: &str = "10.77.0.1";

/// A namespace joined to the calling thread's by a veth pair, this side `POD_SIDE` and the other
/// 10.77.0.2: where the pod's clients run, so that the pod's socket table shows only its own end
/// of their connections, as in a real pod.
pub fn outside() -> Netns {
    let out = Netns::new();
    let ip = |cmd: &mut Command, args: &[&str]| {
        let done = cmd.args(args).status().expect("iproute2's ip (Debian's iproute2)");
        assert!(done.success(), "ip {args:?}");
    };
    let path = out.path();
    ip(&mut Command::new("ip"), &["link", "add", "pod0", "type", "veth", "peer", "name", "out0"]);
    ip(&mut Command::new("ip"), &["link", "set", "out0", "netns", &path]);
    ip(&mut Command::new("ip"), &["addr", "add", &format!("{POD_SIDE}/24"), "dev", "pod0"]);
    ip(&mut Command::new("ip"), &["link", "set", "pod0", "up"]);
    ip(&mut out.command("ip"), &["addr", "add", "10.77.0.2/24", "dev", "out0"]);
    ip(&mut out.command("ip"), &["link", "set", "out0", "up"]);
    out
}

/// Moves the calling thread into the namespace behind `fd`.
fn join(fd: RawFd) {
    // SAFETY: setns on a namespace descriptor we hold; it changes only this thread.
    let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

/// `ip link set lo up`, without needing iproute2.
fn loopback_up() {
    // SAFETY: ioctls on a socket we own with a zeroed, correctly named ifreq.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        assert_eq!(libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req), 0, "SIOCGIFFLAGS lo");
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        assert_eq!(
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &req),
            0,
            "SIOCSIFFLAGS lo: {}",
            std::io::Error::last_os_error()
        );
        libc::close(fd);
    }
}
