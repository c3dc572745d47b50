//! `outcome::SIGNALS` during the wait: the summary, then exit 128 + the signal. Blocked first thing
//! in `main`, then taken by a thread (sigwait): seen even while a request is in flight.

use crate::outcome::SIGNALS;
use std::thread;

/// Whether `sig` started ignored (nohup's SIGHUP), which the wait keeps; never SIGINT or SIGTERM.
fn ignored(sig: i32) -> bool {
    // SAFETY: sigaction with a null new action only reads the current one into `old`.
    let handler = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(sig, std::ptr::null(), &mut old) == 0).then_some(old.sa_sigaction)
    };
    handler == Some(libc::SIG_IGN) && sig != libc::SIGINT && sig != libc::SIGTERM
}

/// `SIGNALS` but the ignored, blocked here and in threads spawned later; `None`: not blocked.
pub struct Blocked(Option<libc::sigset_t>);

/// Blocks the signals; call before spawning any thread.
pub fn block() -> Blocked {
    // SAFETY: plain libc calls on a sigset_t we own, initialised by sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for (sig, _) in SIGNALS.iter().filter(|(sig, _)| !ignored(*sig)) {
            libc::sigaddset(&mut set, *sig);
        }
        let ok = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) == 0;
        Blocked(ok.then_some(set))
    }
}

impl Blocked {
    /// Unblocks them: a command that does not wait keeps their default actions (one already
    /// sent acts now).
    pub fn release(self) {
        if let Some(set) = self.0 {
            // SAFETY: as in `block`.
            unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
        }
    }

    /// Starts a thread that calls `report`, which should exit, with the first of them (one sent
    /// since `block` included); a second ends the process. False when they could not be taken
    /// over (then they are unblocked).
    pub(crate) fn on_interrupt(self, report: impl FnOnce(i32) + Send + 'static) -> bool {
        let Some(set) = self.0 else { return false };
        let spawned = thread::Builder::new()
            .name("signals".to_string())
            .stack_size(64 * 1024)
            .spawn(move || {
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
            Blocked(Some(set)).release();
            return false;
        }
        true
    }
}
