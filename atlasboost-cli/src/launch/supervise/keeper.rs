//! The launcher's heartbeats while its loop is held elsewhere: a console written whole that
//! takes nothing (a file on a hung mount, a socket), a slow `--events` file, a long pass.
//! (A terminal is written by a thread of its own, `launch/terminal.rs`, so a paused one no
//! longer holds the loop.) The agents and relays must still hear that the launcher is there,
//! or they would stop their workers after `--host-timeout` (`LOST_AFTER`, 4 s, by default).
//!
//! A thread looks twice a heartbeat whether the loop went round since it last looked; if
//! not, it sends each peer a heartbeat itself (so a peer waits at most about two
//! heartbeats; an idle loop may get an extra one, which costs nothing), on the peer's [`Commands`], which a command being
//! written holds locked (then that peer hears the command instead).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::super::channel::HEARTBEAT;
use super::super::remote::Commands;

/// See the module's documentation. Stopped when dropped.
#[derive(Debug)]
pub struct Keeper {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    stop: AtomicBool,
    /// How many times the loop went round.
    rounds: AtomicU64,
    peers: Mutex<Vec<Commands>>,
    /// When the keeper last spoke for the loop: microseconds after `started`, plus one (0:
    /// never).
    spoke: AtomicU64,
    started: Instant,
}

impl Keeper {
    /// Starts keeping `peers` (more may be added with [`Keeper::watch`]). `None` if the thread
    /// cannot be started: the loop's own heartbeats go on as before.
    pub fn start(peers: Vec<Commands>) -> Option<Keeper> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
            peers: Mutex::new(peers),
            spoke: AtomicU64::new(0),
            started: Instant::now(),
        });
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("heartbeats".into())
            .spawn(move || keep(&theirs))
            .ok()?;
        Some(Keeper {
            shared,
            thread: Some(thread),
        })
    }

    /// One more peer (a relay admitted after the start).
    pub fn watch(&self, peer: Commands) {
        self.shared
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(peer);
    }

    /// The loop went round: it sends the heartbeats itself.
    pub fn round(&self) {
        self.shared.rounds.fetch_add(1, Ordering::Relaxed);
    }

    /// When the keeper last sent the peers heartbeats for the loop, if it ever did.
    pub fn last_spoke(&self) -> Option<Instant> {
        match self.shared.spoke.load(Ordering::Relaxed) {
            0 => None,
            us => Some(self.shared.started + Duration::from_micros(us - 1)),
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn keep(shared: &Shared) {
    let mut seen = shared.rounds.load(Ordering::Relaxed);
    loop {
        std::thread::park_timeout(HEARTBEAT / 2);
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let now = shared.rounds.load(Ordering::Relaxed);
        if now == seen {
            let peers = shared.peers.lock().unwrap_or_else(PoisonError::into_inner);
            for p in peers.iter() {
                p.try_heartbeat();
            }
            let us = u64::try_from(shared.started.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
            shared.spoke.store(us + 1, Ordering::Relaxed);
        }
        seen = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_go_out_only_while_the_loop_is_held() {
        use std::io::Read;
        let (read, write) = std::io::pipe().unwrap();
        let peer = Commands::for_test(std::fs::File::from(std::os::fd::OwnedFd::from(write)));
        let keeper = Keeper::start(vec![peer]).unwrap();
        // The loop goes round often: the keeper stays quiet (but for one heartbeat, should
        // this thread not be run for half a second on a loaded machine).
        for _ in 0..40 {
            keeper.round();
            std::thread::sleep(HEARTBEAT / 20);
        }
        let mut read = std::fs::File::from(std::os::fd::OwnedFd::from(read));
        nix::fcntl::fcntl(
            &read,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        let mut got = Vec::new();
        let _ = read.read_to_end(&mut got);
        assert!(got.len() <= 3, "nothing while the loop goes round: {got:?}");
        got.clear();
        // Held for 2.5 heartbeats: it speaks for the loop.
        std::thread::sleep(HEARTBEAT * 5 / 2);
        let _ = read.read_to_end(&mut got);
        let said = String::from_utf8_lossy(&got);
        assert!(
            said.matches("hb\n").count() >= 2 && said.replace("hb\n", "").is_empty(),
            "whole heartbeats, about two a heartbeat: {said:?}"
        );
        let started = std::time::Instant::now();
        drop(keeper);
        assert!(started.elapsed() < HEARTBEAT / 2, "stopped at once");
    }
}
