//! An in-process [`Rendezvous`]: participants are threads of one process.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use atlasboost_core::{Error, Rendezvous, Result};

use crate::SimError;

/// Creates the participants of one in-process group.
#[derive(Debug)]
pub struct InProcessGroup;

impl InProcessGroup {
    /// `size` participants (indices `0..size`) whose operations time out after `timeout`.
    pub fn participants(size: usize, timeout: Duration) -> Vec<InProcessRendezvous> {
        let shared = Arc::new(Shared {
            size,
            timeout,
            state: Mutex::new(State {
                round: 0,
                slots: vec![None; size],
                arrived: 0,
                last: Arc::new(Vec::new()),
                failed: None,
            }),
            cv: Condvar::new(),
        });
        (0..size)
            .map(|index| InProcessRendezvous {
                index,
                shared: Arc::clone(&shared),
            })
            .collect()
    }
}

#[derive(Debug)]
struct Shared {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug)]
struct State {
    /// Completed rounds.
    round: u64,
    /// Payloads of the round in progress.
    slots: Vec<Option<Vec<u8>>>,
    arrived: usize,
    /// The result of the last completed round.
    last: Arc<Vec<Vec<u8>>>,
    /// Once set, every operation fails with it: all or nothing.
    failed: Option<SimError>,
}

/// One participant of an [`InProcessGroup`].
#[derive(Debug)]
pub struct InProcessRendezvous {
    index: usize,
    shared: Arc<Shared>,
}

impl InProcessRendezvous {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A participant that panicked while holding the lock leaves consistent state behind
        // (each update is a few assignments), so keep going.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn fail(e: SimError) -> Error {
        Error::Rendezvous {
            backend: "in-process".into(),
            temporary: matches!(e, SimError::Timeout { .. }),
            source: Box::new(e),
        }
    }
}

impl Rendezvous for InProcessRendezvous {
    fn index(&self) -> usize {
        self.index
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_gather(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>> {
        let shared = Arc::clone(&self.shared);
        let mut state = self.lock();
        if let Some(e) = &state.failed {
            return Err(Self::fail(e.clone()));
        }
        let my_round = state.round;
        state.slots[self.index] = Some(payload.to_vec());
        state.arrived += 1;
        if state.arrived == shared.size {
            let result: Vec<Vec<u8>> = state
                .slots
                .iter_mut()
                .map(|s| s.take().unwrap_or_default())
                .collect();
            state.last = Arc::new(result);
            state.arrived = 0;
            state.round += 1;
            shared.cv.notify_all();
            return Ok(state.last.to_vec());
        }
        let deadline = Instant::now() + shared.timeout;
        loop {
            if state.round > my_round {
                // The next round cannot complete without us, so `last` is our round's result.
                return Ok(state.last.to_vec());
            }
            if let Some(e) = &state.failed {
                return Err(Self::fail(e.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing = state
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.is_none())
                    .map(|(i, _)| i)
                    .collect();
                let e = SimError::Timeout {
                    after: shared.timeout,
                    missing,
                };
                state.failed = Some(e.clone());
                shared.cv.notify_all();
                return Err(Self::fail(e));
            }
            state = shared
                .cv
                .wait_timeout(state, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
    }

    fn barrier(&mut self) -> Result<()> {
        self.all_gather(&[]).map(drop)
    }
}

impl Drop for InProcessRendezvous {
    /// A participant that goes away (its thread ended or panicked) fails the group's pending
    /// and future rounds at once instead of leaving the others to time out.
    fn drop(&mut self) {
        let index = self.index;
        let mut state = self.lock();
        if state.failed.is_none() {
            state.failed = Some(SimError::Left { index });
        }
        self.shared.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use atlasboost_core::conformance;

    use super::*;

    fn boxed(group: Vec<InProcessRendezvous>) -> Vec<Box<dyn Rendezvous>> {
        group
            .into_iter()
            .map(|r| Box::new(r) as Box<dyn Rendezvous>)
            .collect()
    }

    #[test]
    fn conformance_suite_passes_for_groups_of_many_sizes() {
        for size in [1, 2, 3, 8, 64] {
            let group = InProcessGroup::participants(size, Duration::from_secs(30));
            conformance::run_in_threads(boxed(group), Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("size {size}: {e}"));
        }
    }

    #[test]
    fn a_missing_participant_is_named_after_the_timeout() {
        let mut group = InProcessGroup::participants(3, Duration::from_millis(300));
        let absent = group.pop(); // participant 2 never calls, but stays alive
        let handles: Vec<_> = group
            .into_iter()
            .map(|mut r| thread::spawn(move || r.all_gather(b"x")))
            .collect();
        for h in handles {
            let err = h.join().unwrap().unwrap_err();
            let text = atlasboost_core::exchange::error_chain(&err);
            assert!(text.contains("participants [2]"), "{text}");
            assert!(err.is_temporary());
        }
        drop(absent);
    }

    #[test]
    fn a_participant_that_leaves_fails_the_others_at_once() {
        let mut group = InProcessGroup::participants(3, Duration::from_secs(60));
        let leaver = group.pop();
        let started = Instant::now();
        let handles: Vec<_> = group
            .into_iter()
            .map(|mut r| thread::spawn(move || r.all_gather(b"x")))
            .collect();
        thread::sleep(Duration::from_millis(50));
        drop(leaver);
        for h in handles {
            let err = h.join().unwrap().unwrap_err();
            let text = atlasboost_core::exchange::error_chain(&err);
            assert!(text.contains("participant 2 left"), "{text}");
        }
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn rendezvous_is_usable_as_dyn() {
        fn takes(_: &mut dyn Rendezvous) {}
        let mut group = InProcessGroup::participants(1, Duration::from_secs(1));
        takes(&mut group[0]);
        assert_eq!(
            group[0].all_gather(b"solo").unwrap(),
            vec![b"solo".to_vec()]
        );
    }
}
