//! The signals that end a process by default (`outcome::SIGNALS`) during the wait: the summary
//! line, then exit 128 + the signal. A thread takes them (sigwait), so one is seen even while a
//! request is in flight, with no signal handler.

use crate::outcome::SIGNALS;
use std::thread;

/// Whether `sig` was ignored when the process started: `nohup` ignores SIGHUP, a shell's
/// background job SIGQUIT, and the wait keeps that. SIGINT and SIGTERM are always taken.
fn ignored(sig: i32) -> bool {
    if sig == libc::SIGINT || sig == libc::SIGTERM {
        return false;
    }
    // SAFETY: sigaction with a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Blocks `SIGNALS` (but those started ignored) in the calling thread (and the threads it spawns
/// later) and starts a thread that calls `report`, which should exit, with the first; a second
/// ends the process. Call before spawning any other thread. False when the signals could not be
/// taken over.
pub fn on_interrupt(report: impl FnOnce(i32) + Send + 'static) -> bool {
    // SAFETY: plain libc calls on a sigset_t we own; the set is fully initialised by
    // sigemptyset before use.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for (sig, _) in SIGNALS.iter().filter(|(sig, _)| !ignored(*sig)) {
            libc::sigaddset(&mut set, *sig);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return false;
        }
        set
    };
    let spawned =
        thread::Builder::new().name("signals".to_string()).stack_size(64 * 1024).spawn(move || {
            let mut sig = 0;
            // SAFETY: sigwait and signal with valid arguments; SIG_DFL restores the default.
            unsafe {
                if libc::sigwait(&set, &mut sig) != 0 {
                    return;
                }
                for (other, _) in SIGNALS {
                    if libc::sigismember(&set, other) == 1 {
                        libc::signal(other, libc::SIG_DFL);
                    }
                }
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            }
            report(sig);
        });
    if spawned.is_err() {
        // SAFETY: as above; without the thread the signals must not stay blocked.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
        return false;
    }
    true
}
