//! The kernel's socket table has two readers: netlink (sock_diag), the default, and the text
//! tables (`--proc-net`, and the fallback). Over real sockets of every kind, in a network
//! namespace of the test's own, they give the same count and the same breakdown; under churn
//! neither loses a connection that stays open; and where netlink is refused, the text tables take
//! over and the log says so once.

mod support;

use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::netns::in_private_netns;
use support::{command, hold, run, spawn, watch_sockets};

/// The uid "Envoy" creates its sockets as; root stands for everyone else.
const PROXY_UID: u32 = 1337;

/// Creates what `make` creates as `uid`: a socket belongs to the filesystem uid of the thread
/// that made it (and an accepted one to that of the thread that accepted it).
fn as_uid<T>(uid: u32, make: impl FnOnce() -> T) -> T {
    // SAFETY: setfsuid changes only this thread's filesystem uid; it is set back before return.
    unsafe { libc::setfsuid(uid) };
    let made = make();
    // SAFETY: as above.
    unsafe { libc::setfsuid(0) };
    made
}

/// A connection that stays in SYN_SENT: its SYNs to `to` are dropped.
fn syn_sent(to: SocketAddr) -> OwnedFd {
    let SocketAddr::V4(v4) = to else { panic!("IPv4 only") };
    // SAFETY: socket() takes no pointers; its result is checked, then owned.
    let fd = unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
    };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: addr lives across the call, with its size passed.
    let r = unsafe {
        libc::connect(
            fd,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let e = std::io::Error::last_os_error();
    assert!(r == -1 && e.raw_os_error() == Some(libc::EINPROGRESS), "{e}");
    owned
}

fn iptables(args: &str) {
    let out = Command::new("iptables").args(args.split(' ')).output().unwrap_or_else(|e| {
        panic!("NOT RUN: iptables is needed for SYN_SENT and SYN_RECV sockets ({e})")
    });
    assert!(out.status.success(), "iptables {args}: {out:?}");
}

/// Everything the namespace holds: kept open while this lives.
struct Zoo {
    _keep: Vec<Box<dyn std::any::Any>>,
}

/// Real sockets of every kind the rule distinguishes, owned by the proxy's uid or by root:
/// listeners on IPv4, IPv6 and both; connections accepted on each (an IPv4 one on the dual
/// listener shows as v4-mapped); one still in the accept queue; one in SYN_RECV (its last ACK
/// dropped); one in CLOSE_WAIT; the proxy's and root's connections out, one stuck in SYN_SENT;
/// the proxy's admin listener on 127.0.0.1:7000.
fn zoo() -> Zoo {
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    iptables("-A INPUT -p tcp --dport 7001 --syn -j DROP");
    iptables("-A INPUT -p tcp --dport 7002 --tcp-flags SYN,ACK,FIN,RST ACK -j DROP");
    let v4 = |port| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let v6 = |port| SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    let listen = |a: SocketAddr| TcpListener::bind(a).unwrap();
    let proxy = as_uid(PROXY_UID, || {
        [
            listen(v4(7000)),
            listen(v4(7010)),
            listen(v6(7011)),
            listen(SocketAddr::from((Ipv6Addr::UNSPECIFIED, 7012))),
            listen(v4(7002)),
        ]
    });
    let app = listen(v4(8080));
    for (listener, to) in
        [(&proxy[1], v4(7010)), (&proxy[2], v6(7011)), (&proxy[3], v4(7012)), (&proxy[3], v6(7012))]
    {
        let client = TcpStream::connect(to).unwrap();
        let (server, _) = as_uid(PROXY_UID, || listener.accept().unwrap());
        keep.push(Box::new((client, server)));
    }
    // The app's own connection, in and out of root's hands.
    let client = TcpStream::connect(v4(8080)).unwrap();
    keep.push(Box::new((client, app.accept().unwrap().0)));
    // Envoy's upstream connection to the app.
    let upstream = as_uid(PROXY_UID, || TcpStream::connect(v4(8080)).unwrap());
    keep.push(Box::new((upstream, app.accept().unwrap().0)));
    // CLOSE_WAIT on the proxy's side: the client has closed its half.
    let client = TcpStream::connect(v4(7010)).unwrap();
    let (server, _) = as_uid(PROXY_UID, || proxy[1].accept().unwrap());
    client.shutdown(Shutdown::Write).unwrap();
    keep.push(Box::new((client, server)));
    // Never accepted: in the listener's queue, with no inode yet.
    keep.push(Box::new(TcpStream::connect(v4(7010)).unwrap()));
    // SYN_RECV on the proxy's listener: the client is established, the server never sees its ACK.
    keep.push(Box::new(TcpStream::connect(v4(7002)).unwrap()));
    keep.push(Box::new(as_uid(PROXY_UID, || syn_sent(SocketAddr::from(([127, 0, 0, 2], 7001))))));
    keep.push(Box::new(syn_sent(SocketAddr::from(([127, 0, 0, 3], 7001)))));
    keep.push(Box::new(proxy));
    keep.push(Box::new(app));
    Zoo { _keep: keep }
}

/// `status --source proc` with `admin`, by netlink and by the text tables; the first line (the
/// reader) differs, the rest must not.
fn both_readers(admin: &str) -> (String, String) {
    let base = ["status", "--source", "proc", "--admin", admin];
    let netlink = run(command(&base));
    let text = run(command(&[&base[..], &["--proc-net", "/proc/net"]].concat()));
    for out in [&netlink, &text] {
        assert_eq!(out.code, Some(0), "{out}");
    }
    assert!(
        netlink.stdout.starts_with("proc: the kernel's socket table (netlink sock_diag)\n"),
        "{netlink}"
    );
    assert!(text.stdout.starts_with("proc: /proc/net/tcp and tcp6\n"), "{text}");
    let body = |s: &str| s.split_once('\n').map(|(_, b)| b.to_string()).unwrap();
    (body(&netlink.stdout), body(&text.stdout))
}

#[test]
#[ignore = "needs root (a network namespace) and iptables: `bash scripts/test` runs it"]
fn netlink_and_the_text_tables_count_and_break_down_every_kind_of_socket_alike() {
    in_private_netns(|| {
        let _zoo = zoo();
        // Envoy told by owner (no process of uid 1337 holds the admin listener), by process (the
        // test holds root's app listener, standing in for Envoy), and not at all.
        for admin in ["127.0.0.1:7000", "127.0.0.1:8080", "127.0.0.1:1"] {
            let (netlink, text) = both_readers(admin);
            assert_eq!(netlink, text, "with --admin {admin}");
        }
        let (by_owner, _) = both_readers("127.0.0.1:7000");
        for row in [
            "port 7002",
            "port 7010",
            "port 7011",
            "port 7012",
            "Envoy's upstream connection to port 8080",
            "Envoy's upstream connection to port 7001",
            "another process's socket (uid 0)",
            "listening",
        ] {
            assert!(by_owner.contains(row), "a row {row:?}:\n{by_owner}");
        }
        // 7002: the SYN_RECV; 7010: one accepted, one in CLOSE_WAIT, one queued; 7011: one;
        // 7012: one IPv6, one v4-mapped.
        assert!(
            by_owner.contains("run would count 7 active connections (from proc)"),
            "{by_owner}"
        );
    });
}

#[test]
#[ignore = "needs root (a network namespace) and iptables: `bash scripts/test` runs it"]
fn under_churn_neither_reader_loses_a_connection_that_stays_open() {
    in_private_netns(|| {
        let steady = hold(5);
        // Enough idle sockets that a dump spans many datagrams, and connections opening and
        // closing around them the whole time.
        let crowd = hold(400);
        let (port, idle) = (crowd.port, crowd.listener.try_clone().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let churn = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(60);
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    let c = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    drop((c, idle.accept().unwrap()));
                    n += 1;
                }
                n
            })
        };
        let mut seen = Vec::new();
        for proc_net in [None, Some("/proc/net")] {
            for _ in 0..20 {
                let steady_port = steady.port.to_string();
                let mut args = vec!["status", "--source", "proc", "--ports", &steady_port];
                args.extend(proc_net.iter().flat_map(|d| ["--proc-net", *d]));
                let out = run(command(&args));
                seen.push((proc_net, out.stdout.lines().last().unwrap_or("").to_string()));
            }
        }
        stop.store(true, Ordering::Relaxed);
        let churned = churn.join().unwrap();
        drop((steady, crowd));
        assert!(churned > 20, "connections opened and closed meanwhile: {churned}");
        for (reader, last) in seen {
            assert_eq!(
                last, "run would count 5 active connections (from proc)",
                "reader {reader:?}"
            );
        }
    });
}

/// A seccomp filter under which socket(AF_NETLINK, ...) fails with EPROTONOSUPPORT, as under
/// gVisor, which has no NETLINK_SOCK_DIAG.
fn without_netlink(cmd: &mut Command) {
    let filter = [
        // The syscall number; anything but socket() is allowed.
        bpf(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        bpf(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 3, libc::SYS_socket as u32),
        // Its first argument, the family (the low half of args[0] on a little-endian machine).
        bpf(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 16),
        bpf(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 1, libc::AF_NETLINK as u32),
        bpf(
            libc::BPF_RET | libc::BPF_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::EPROTONOSUPPORT as u32,
        ),
        bpf(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    // SAFETY: the closure runs in the child between fork and exec and only makes two prctl
    // calls on data it owns.
    unsafe {
        cmd.pre_exec(move || {
            let prog =
                libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &raw const prog)
                    != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
}

fn bpf(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt, jf, k }
}

#[test]
#[ignore = "needs root (a network namespace) and iptables: `bash scripts/test` runs it"]
fn where_netlink_is_refused_the_text_tables_count_and_the_log_says_so_once() {
    in_private_netns(|| {
        let listener = TcpListener::bind("127.0.0.1:7030").unwrap();
        let pair = (TcpStream::connect("127.0.0.1:7030").unwrap(), listener.accept().unwrap());
        let mut status = command(&["status", "--source", "proc"]);
        without_netlink(&mut status);
        let out = run(status);
        assert_eq!(out.code, Some(0), "{out}");
        let why = "netlink sock_diag is unavailable (failed to open a NETLINK_SOCK_DIAG socket: \
                   protocol not supported): reading /proc/net/tcp and tcp6 instead";
        assert!(out.stdout.contains(why), "{out}");
        assert!(out.stdout.contains("run would count 1 active connection (from proc)"), "{out}");
        let mut hook = watch_sockets(&[
            "--min-drain",
            "0s",
            "--interval",
            "50ms",
            "--deadline",
            "30s",
            "--verbose",
        ]);
        without_netlink(&mut hook);
        let mut r = spawn(hook);
        for _ in 0..5 {
            r.expect_line("1 active connection (proc)", Duration::from_secs(10));
        }
        drop(pair);
        let out = r.finish();
        assert_eq!(out.code, Some(0), "{out}");
        assert_eq!(out.stderr.matches(why).count(), 1, "once {out}");
        assert!(out.last_line().contains("0 active connections (proc)"), "{out}");
    });
}

#[test]
#[ignore = "needs root (a network namespace): `bash scripts/test` runs it"]
fn hold_that_cannot_read_arrivals_never_returns_early_exits_3_and_says_why() {
    // Neither /clusters (a silent admin API, a backlog never accepted, and a refused one) nor
    // the socket table can tell arrivals: the text tables, where netlink is refused, have no byte
    // counts, and a connection is open whose requests they cannot see. Unknown is never quiet.
    in_private_netns(|| {
        let listener = TcpListener::bind("127.0.0.1:7031").unwrap();
        let _pair = (TcpStream::connect("127.0.0.1:7031").unwrap(), listener.accept().unwrap());
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let refused = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        for admin in [silent.local_addr().unwrap(), refused] {
            let out = hold_blind(&["--admin", &admin.to_string()]);
            assert_eq!(out.code, Some(3), "{out}");
            assert!(
                out.elapsed >= Duration::from_secs(2)
                    && out.elapsed < Duration::from_millis(2000 + 400),
                "held to the deadline, not past it {out}"
            );
            assert!(
                out.last_line().contains(
                    "deadline of 2s passed after 2.0s and nothing could be counted: no source \
                     told what arrived"
                ) && out.stderr.contains(
                    "reading arrivals from /proc/net/tcp and tcp6 instead, which shows no bytes received"
                ),
                "{out}"
            );
        }
        // Without a sidecar the socket table is all there is.
        for preset in ["ambient", "none"] {
            let out = hold_blind(&["--preset", preset]);
            assert_eq!(out.code, Some(3), "{preset} {out}");
            assert!(out.elapsed < Duration::from_millis(2000 + 400), "{preset} {out}");
            assert!(
                out.last_line().contains("nothing could be counted: no source told what arrived")
                    && out.stderr.contains("arrivals unknown: the socket table shows no bytes"),
                "{preset} {out}"
            );
        }
    });
}

/// `hold` with these flags, a quiet time of 500 ms and a deadline of 2 s, where netlink is
/// refused (the text tables show no bytes received).
fn hold_blind(flags: &[&str]) -> support::Finished {
    let timing = ["--min", "0s", "--quiet", "500ms", "--deadline", "2s"];
    let mut cmd = command(&[&["hold"][..], flags, &timing].concat());
    without_netlink(&mut cmd);
    run(cmd)
}
