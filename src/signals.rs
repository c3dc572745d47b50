//! SIGINT and SIGTERM during the wait: the summary line is printed, then the process exits with
//! 130 or 143. A thread waits for the signals (sigwait), so a signal is seen at once even while an
//! admin request is in flight, and nothing unsafe runs in a signal handler.

use std::thread;

/// Blocks SIGINT and SIGTERM in the calling thread, which every thread spawned later inherits,
/// and starts a thread that calls `report` with the first one. `report` is expected to exit the
/// process; a second signal while it runs ends the process at once. Call before spawning any
/// other thread. Returns false when the signals could not be taken over (they then keep their
/// default action, which ends the process without a summary).
pub fn on_interrupt(report: impl FnOnce(i32) + Send + 'static) -> bool {
    // SAFETY: plain libc calls on a sigset_t we own; the set is fully initialised by
    // sigemptyset before use.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
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
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGTERM, libc::SIG_DFL);
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
