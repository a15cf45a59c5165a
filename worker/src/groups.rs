//! The process groups `shell` started, and killing them.
//!
//! Each command runs as the leader of its own process group, so one `killpg(SIGKILL)`
//! reaches the shell and everything it started (pipelines, background jobs) at once. A
//! call that is cancelled, times out or is dropped kills its group through [`GroupGuard`];
//! the end of the session kills every group ever started ([`Groups::kill_all`]), so
//! nothing a command left running outlives the channel.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Sends SIGKILL to process group `pgid`. A group already gone is not an error.
pub fn kill_group(pgid: u32) {
    let Ok(raw) = i32::try_from(pgid) else {
        return;
    };
    // pgid 0 or 1 would mean "our own group" or init: never a command's group.
    if raw <= 1 {
        return;
    }
    match killpg(Pid::from_raw(raw), Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(err) => tracing::warn!(pgid, errno = %err, "killpg failed"),
    }
}

/// Every process group started in this session.
#[derive(Clone, Default)]
pub struct Groups {
    started: Arc<Mutex<HashSet<u32>>>,
}

impl Groups {
    /// Records `pgid` and returns a guard that kills it when dropped (unless detached).
    pub fn register(&self, pgid: u32) -> GroupGuard {
        if let Ok(mut started) = self.started.lock() {
            started.insert(pgid);
        }
        GroupGuard {
            pgid,
            armed: true,
            groups: self.clone(),
        }
    }

    /// Kills every group started in this session; returns how many there were.
    pub fn kill_all(&self) -> usize {
        let pgids: Vec<u32> = match self.started.lock() {
            Ok(mut started) => started.drain().collect(),
            Err(_) => Vec::new(),
        };
        for pgid in &pgids {
            kill_group(*pgid);
        }
        pgids.len()
    }

    fn forget(&self, pgid: u32) {
        if let Ok(mut started) = self.started.lock() {
            started.remove(&pgid);
        }
    }
}

/// Kills its process group when dropped: a call future dropped at any await point never
/// leaves its command running.
pub struct GroupGuard {
    pgid: u32,
    armed: bool,
    groups: Groups,
}

impl GroupGuard {
    pub fn pgid(&self) -> u32 {
        self.pgid
    }

    /// Kills the group now.
    pub fn kill(&mut self) {
        kill_group(self.pgid);
        self.armed = false;
        self.groups.forget(self.pgid);
    }

    /// The command exited by itself: processes it left in the background keep running
    /// until the session ends (they are still in [`Groups`]).
    pub fn detach(mut self) {
        self.armed = false;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            self.kill();
        }
    }
}
