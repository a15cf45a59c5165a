//! What a session's commands reached: one record per request (or per tunnel), with the
//! host, method, status and byte counts, never a body, a header or a path. Kept in
//! memory, the latest [`MAX_RECORDS`], for the session's listing; and until a ledger
//! writer takes them (at most [`MAX_RECORDS`] waiting, the rest counted as dropped).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::SystemTime;

use serde::Serialize;

pub const MAX_RECORDS: usize = 1000;

/// One request through the proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Record {
    pub host: String,
    pub port: u16,
    /// The HTTP method; `CONNECT` for a tunnel passed through untouched.
    pub method: String,
    /// The status the command received (403: refused by the proxy).
    pub status: u16,
    /// Why the proxy refused or failed it (`host_not_allowed`, `private_address`, …).
    pub refused: Option<&'static str>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Whether the proxy ended TLS to set an egress secret.
    pub intercepted: bool,
    /// When the request was answered (or refused).
    pub at: SystemTime,
}

/// The session's records and running totals, shared by its connections.
#[derive(Debug, Default)]
pub struct Ledger {
    records: Mutex<VecDeque<Record>>,
    /// Records no writer has taken yet, and how many were dropped for want of room.
    untaken: Mutex<(Vec<Record>, u64)>,
    /// Every request counted, beyond those kept.
    pub requests: AtomicU64,
    /// Bytes both ways, for the session's byte bound.
    pub bytes: AtomicU64,
    /// Client connections open now, for the connection bound.
    pub connections: AtomicUsize,
}

impl Ledger {
    pub fn push(&self, record: Record) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut records = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if records.len() == MAX_RECORDS {
            records.pop_front();
        }
        records.push_back(record.clone());
        drop(records);
        let mut untaken = self
            .untaken
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if untaken.0.len() < MAX_RECORDS {
            untaken.0.push(record);
        } else {
            untaken.1 += 1;
        }
    }

    /// The records not taken before, and the count dropped meanwhile.
    pub fn take(&self) -> (Vec<Record>, u64) {
        std::mem::take(
            &mut *self
                .untaken
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// The records kept, oldest first.
    pub fn records(&self) -> Vec<Record> {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }
}
