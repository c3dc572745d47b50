//! A network namespace of the test's own, so /proc/net/tcp shows only the test's sockets and any
//! port is free.

use std::thread;

/// Runs `f` on a new thread moved into a new network namespace with its loopback up. Sockets it
/// opens and processes it starts live there. A test that needs this fails loudly where the
/// namespace cannot be made (it needs root, as in CI): it never passes without having run.
pub fn in_private_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let worker = thread::spawn(move || {
        // SAFETY: unshare affects only this thread, which owns nothing yet.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            panic!(
                "NOT RUN: cannot make a private network namespace ({}); this test needs root \
                 (CAP_SYS_ADMIN), as the README's test command has in CI",
                std::io::Error::last_os_error()
            );
        }
        loopback_up();
        f()
    });
    worker
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
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
        assert_eq!(
            libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req),
            0,
            "SIOCGIFFLAGS lo"
        );
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
