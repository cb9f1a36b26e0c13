//! How a participant waits, for an embedding program that must know: a Python interpreter lets
//! its other threads run only while the wait has given up its lock (the GIL), and runs its
//! signal handlers only when asked.

use std::sync::OnceLock;

/// What [`set_wait_hooks`] installs.
#[derive(Debug, Clone, Copy)]
pub struct WaitHooks {
    /// Runs a wait (a `poll` of the participant's socket, which touches nothing but the
    /// socket): e.g. with the interpreter's lock released.
    pub blocking: fn(&mut dyn FnMut()),
    /// Called after each wait that a signal interrupted (`EINTR`) or that timed out (at least
    /// every 2 s, so that a signal that came while no wait was under way is seen too): runs
    /// the program's handlers, and says whether the wait should stop (a handler raised, e.g.
    /// `KeyboardInterrupt`). `false`: the wait goes on, as a system call restarts after a
    /// handler that returns (PEP 475).
    pub interrupted: fn() -> bool,
}

static HOOKS: OnceLock<WaitHooks> = OnceLock::new();

/// Installs `hooks` for every participant of this process, once (a second call keeps the
/// first). Without them a wait runs as it is, and a signal that interrupts it ends it (the
/// caller gets the error, as from any system call without `SA_RESTART`).
pub fn set_wait_hooks(hooks: WaitHooks) {
    let _ = HOOKS.set(hooks);
}

/// Runs `wait` as the hooks say.
pub(crate) fn blocking(wait: &mut dyn FnMut()) {
    match HOOKS.get() {
        Some(h) => (h.blocking)(wait),
        None => wait(),
    }
}

/// Whether a wait a signal interrupted should stop rather than go on.
pub(crate) fn stop_after_interrupt() -> bool {
    HOOKS.get().is_none_or(|h| (h.interrupted)())
}

/// Whether a wait that timed out should stop: a signal came meanwhile and the program's
/// handler asks so (only with hooks: without them there is nobody to ask).
pub(crate) fn stop_after_timeout() -> bool {
    HOOKS.get().is_some_and(|h| (h.interrupted)())
}
