//! The supervisor's stop and escalation policy, as pure functions: what a signal means in each
//! state, and when a stop becomes SIGKILL. The supervisor applies the answers (like nextest's
//! mapping of a reason to a signal), so the policy is tested without processes.

use std::time::Duration;

/// Where the supervisor stands when a signal (other than SIGCHLD) arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalState {
    /// It is an agent (a remote host's, or a relay), not the launcher.
    pub agent: bool,
    /// An agent whose parent stops it with signals (a relay under mpirun), rather than with
    /// its launcher's `sig` commands.
    pub obeys_signals: bool,
    /// The job is already ending: an interruption, a failed worker or a failed host.
    pub ending: bool,
    /// A stop is under way; `Some(true)` once SIGKILL has been sent.
    pub stopping: Option<bool>,
    /// The same signal as the one before it, within [`ECHO`] of it: one event delivered
    /// twice, not a second one.
    pub echo: bool,
    /// A relay's signal from mpirun's side (its parent). mpirun sends one catchable signal to
    /// stop its ranks (its SIGKILL follows `--grace` later): during a stop it is that stop
    /// again, not a second request.
    pub from_mpirun: bool,
}

/// How close together two deliveries of one signal are the same event: a wrapper such as
/// `timeout` sends it to its child and then to its whole process group (the launcher's too),
/// microseconds apart. Nobody presses Ctrl-C twice within it.
pub const ECHO: Duration = Duration::from_millis(100);

/// What the supervisor does with the signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalAction {
    /// Pass it on to every worker and start the grace time (the first stop of a relay).
    PassOn,
    /// Kill every worker now (a second signal during a stop).
    KillNow,
    /// The launcher is gone (an agent got a signal from elsewhere, such as sshd's SIGHUP).
    UpstreamLost,
    /// The user interrupted the job: say so, pass the signal on, start the grace time.
    Interrupt,
    /// Nothing more to do: the stop already under way covers it.
    Nothing,
}

/// What a signal means in `state`.
pub fn on_signal(state: SignalState) -> SignalAction {
    match state {
        SignalState { echo: true, .. } => SignalAction::Nothing,
        SignalState {
            agent: true,
            obeys_signals: true,
            stopping,
            from_mpirun,
            ..
        } => match stopping {
            Some(false) if from_mpirun => SignalAction::Nothing,
            Some(_) => SignalAction::KillNow,
            None => SignalAction::PassOn,
        },
        SignalState { agent: true, .. } => SignalAction::UpstreamLost,
        SignalState {
            ending: true,
            stopping: Some(false),
            ..
        } => SignalAction::KillNow,
        SignalState { ending: true, .. } => SignalAction::Nothing,
        SignalState { .. } => SignalAction::Interrupt,
    }
}

/// Whether a stop that began `elapsed` ago, with `grace` allowed, must now become SIGKILL
/// (`killed`: it already has).
pub fn must_kill(elapsed: Duration, grace: Duration, killed: bool) -> bool {
    !killed && elapsed >= grace
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(agent: bool, obeys: bool, ending: bool, stopping: Option<bool>) -> SignalState {
        SignalState {
            agent,
            obeys_signals: obeys,
            ending,
            stopping,
            echo: false,
            from_mpirun: false,
        }
    }

    #[test]
    fn a_signal_delivered_twice_at_once_is_one() {
        for agent in [false, true] {
            let echo = SignalState {
                echo: true,
                ..state(agent, agent, true, Some(false))
            };
            assert_eq!(on_signal(echo), SignalAction::Nothing);
        }
    }

    #[test]
    fn the_launcher_interrupts_once_then_a_second_signal_kills() {
        assert_eq!(
            on_signal(state(false, false, false, None)),
            SignalAction::Interrupt
        );
        // The interruption is under way (ending, stopping, not yet killed): kill now.
        assert_eq!(
            on_signal(state(false, false, true, Some(false))),
            SignalAction::KillNow
        );
        // Already killed: nothing left to escalate.
        assert_eq!(
            on_signal(state(false, false, true, Some(true))),
            SignalAction::Nothing
        );
    }

    #[test]
    fn a_signal_while_a_failure_stops_the_job_kills_at_once() {
        // A worker failed and the stop (SIGTERM) is under way: Ctrl-C cuts the grace short.
        assert_eq!(
            on_signal(state(false, false, true, Some(false))),
            SignalAction::KillNow
        );
        // A failure recorded before any stop began: the coming stop covers it.
        assert_eq!(
            on_signal(state(false, false, true, None)),
            SignalAction::Nothing
        );
    }

    #[test]
    fn an_agent_hears_a_foreign_signal_as_its_launcher_lost() {
        for ending in [false, true] {
            for stopping in [None, Some(false), Some(true)] {
                assert_eq!(
                    on_signal(state(true, false, ending, stopping)),
                    SignalAction::UpstreamLost
                );
            }
        }
    }

    #[test]
    fn a_relay_passes_the_first_signal_on_and_kills_on_the_second() {
        assert_eq!(
            on_signal(state(true, true, false, None)),
            SignalAction::PassOn
        );
        assert_eq!(
            on_signal(state(true, true, false, Some(false))),
            SignalAction::KillNow
        );
        assert_eq!(
            on_signal(state(true, true, true, Some(true))),
            SignalAction::KillNow
        );
    }

    /// mpirun's stop reaching a relay that the launcher's stop reached first is that stop: the
    /// worker keeps its grace (mpirun's SIGKILL comes `--grace` after its SIGTERM).
    #[test]
    fn a_relay_already_stopping_takes_mpiruns_signal_for_the_same_stop() {
        let from_mpirun = |stopping| SignalState {
            from_mpirun: true,
            ..state(true, true, false, stopping)
        };
        assert_eq!(on_signal(from_mpirun(None)), SignalAction::PassOn);
        assert_eq!(on_signal(from_mpirun(Some(false))), SignalAction::Nothing);
        assert_eq!(on_signal(from_mpirun(Some(true))), SignalAction::KillNow);
    }

    #[test]
    fn a_stop_becomes_sigkill_when_the_grace_is_over_and_only_once() {
        let grace = Duration::from_secs(10);
        assert!(!must_kill(Duration::from_secs(9), grace, false));
        assert!(must_kill(Duration::from_secs(10), grace, false));
        assert!(must_kill(Duration::from_secs(11), grace, false));
        assert!(!must_kill(Duration::from_secs(11), grace, true));
        // --grace 0: SIGKILL at the first tick.
        assert!(must_kill(Duration::ZERO, Duration::ZERO, false));
    }
}
