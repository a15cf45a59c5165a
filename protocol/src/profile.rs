//! The runtime profiles' names (SPEC R): what an agent names as its `runtime_profile`,
//! what the brain checks and queues a session for, and what the runtime-manager launches.
//! Both processes read them from here, so neither can accept a name the other lacks.

/// The mode without hands: nothing is ever launched for it.
pub const NONE: &str = "none";
/// Shell, scripts and files.
pub const LIGHT: &str = "light";
/// Browser tools, with Chromium in the pod.
pub const BROWSER: &str = "browser";
/// Scraping and big compute: high limits, on the workers' nodes.
pub const HEAVY: &str = "heavy";
/// A worker kept alive long past idle.
pub const WARM: &str = "warm";

/// The modes with hands, in the order they are listed and rendered.
pub const WITH_HANDS: [&str; 4] = [LIGHT, BROWSER, HEAVY, WARM];
/// Every mode an agent may name.
pub const ALL: [&str; 5] = [NONE, LIGHT, BROWSER, HEAVY, WARM];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_is_none_or_has_hands() {
        assert_eq!(ALL[0], NONE);
        assert_eq!(&ALL[1..], &WITH_HANDS);
    }
}
