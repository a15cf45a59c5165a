//! The clock that decides dates: the UTC day and month quotas count in, the usage
//! range's default month and the autostart scheduler's ticks. The system's time unless a
//! test pins it, so that no test depends on the minute, day or month it runs in.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Utc};

/// A cheap handle on the present. Clones of a pinned clock share its instant: setting
/// one moves them all.
#[derive(Clone, Debug, Default)]
pub struct Clock(Option<Arc<AtomicI64>>);

impl Clock {
    /// The system's time (what production runs on).
    pub fn system() -> Self {
        Self(None)
    }

    /// Stands still at `at` until [`Clock::set`] moves it.
    pub fn pinned(at: DateTime<Utc>) -> Self {
        Self(Some(Arc::new(AtomicI64::new(micros(at)))))
    }

    pub fn now(&self) -> DateTime<Utc> {
        match &self.0 {
            None => Utc::now(),
            Some(at) => {
                DateTime::from_timestamp_micros(at.load(Ordering::Relaxed)).unwrap_or_default()
            }
        }
    }

    /// Moves a pinned clock (and its clones) to `at`; the system's clock cannot be moved.
    pub fn set(&self, at: DateTime<Utc>) {
        if let Some(pinned) = &self.0 {
            pinned.store(micros(at), Ordering::Relaxed);
        }
    }
}

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_pinned_clock_stands_still_and_moves_with_its_clones() {
        let noon = Utc.with_ymd_and_hms(2026, 6, 15, 12, 0, 0).unwrap();
        let clock = Clock::pinned(noon);
        let clone = clock.clone();
        assert_eq!(clone.now(), noon);
        let next = noon + chrono::TimeDelta::days(1);
        clock.set(next);
        assert_eq!(clone.now(), next);
        let system = Clock::system();
        system.set(noon);
        assert!(system.now() > noon, "the system's clock is not pinned");
    }
}
